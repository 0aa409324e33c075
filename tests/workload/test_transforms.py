"""finalize: stable arrival order, request cap, rate scaling, time window, id assignment."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from workbench.config import RunConfig
from workbench.splitmix import mix64
from workbench.workload import Segment, build_workload, output_key
from workbench.workload.request import Request, output_keys
from workbench.workload.table import OutputRef, RequestTable, finalize

arrivals = st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=60)


@settings(max_examples=80, deadline=None)
@example(times=[0.0, 2.2250738585e-313], cap=None, rate=1.0, duration=None)  # a subnormal span: times 0 and 2 s
@given(times=arrivals, cap=st.one_of(st.none(), st.integers(1, 80)), rate=st.one_of(st.none(), st.floats(0.01, 100)),
       duration=st.one_of(st.none(), st.floats(0.1, 1e4)))
def test_transforms(times, cap, rate, duration):
    t = np.array(times)
    table = RequestTable(t, np.arange(1, len(t) + 1), np.full(len(t), 3))
    spread = len(set(np.sort(t)[: cap or len(t)])) > 1
    if rate is not None and not spread and min(cap or len(t), len(t)) > 1:
        with pytest.raises(ValueError):
            finalize(table, seed=0, rate=rate, duration_s=duration, num_requests=cap)
        return
    requests = finalize(table, seed=0, rate=rate, duration_s=duration, num_requests=cap)
    order = np.argsort(t, kind="stable")[: cap or len(t)]  # [kept by the cap] rows in arrival order
    expected = t[order] - t[order][0]
    if rate is not None and len(expected) > 1:
        with np.errstate(over="ignore"):
            factor = len(expected) / expected[-1] / rate
        expected = expected * factor if np.isfinite(factor) else expected / expected[-1] * (len(expected) / rate)
        assert np.all(np.isfinite(expected))
    if duration is not None:
        expected = expected[expected < duration]
    assert [r.request_id for r in requests] == list(range(len(expected)))
    assert [r.prompt_tokens for r in requests] == (order[: len(expected)] + 1).tolist()  # stable arrival order
    assert np.array_equal([r.arrival_s for r in requests], expected)
    if rate is not None and duration is None and len(expected) > 1:
        assert len(expected) / expected[-1] == pytest.approx(rate, rel=1e-9)


def test_output_refs_resolve_to_final_ids():
    # row 0 arrives last; row 2 quotes row 1's answer; after sorting row 1 is request 0
    table = RequestTable(np.array([9.0, 1.0, 5.0]), np.array([4, 4, 10]), np.array([2, 3, 1]),
                         content=[(Segment(11, 4),), (Segment(22, 4),), (Segment(22, 4), OutputRef(1, 3),
                                                                        Segment(33, 3))])
    a, b, c = finalize(table, seed=0)
    assert (a.content, b.content[1], c.content) == ((Segment(22, 4),), Segment(output_key(0, 0), 3),
                                                    (Segment(11, 4),))


def test_trace_rate_scaling_and_cap(real_trace):
    path = real_trace("azure-llm-2023-conv")
    requests = build_workload(RunConfig(workload=f"azure:{path}", rate=2.0, num_requests=500))
    assert len(requests) == 500
    assert 500 / requests[-1].arrival_s == pytest.approx(2.0)
    stamps = pd.to_datetime(pd.read_csv(path)["TIMESTAMP"], format="ISO8601")
    in_first_minute = int(((stamps - stamps.iloc[0]).dt.total_seconds() < 60.0).sum())
    window = build_workload(RunConfig(workload=f"azure:{path}", duration=60.0))
    assert len(window) == in_first_minute and window[-1].arrival_s < 60.0


def test_vectorized_answer_keys_equal_output_key():
    ids = np.array([0, 1, 7, 123_456, 2**40])
    for sample in (0, 3):
        expected = [int(mix64(np.array([(int(i) << 20) ^ sample ^ (1 << 62)], dtype=np.uint64))[0] >> np.uint64(1))
                    for i in ids]
        assert output_keys(ids, sample).tolist() == expected == [output_key(int(i), sample) for i in ids]


@pytest.mark.parametrize("sessions", [False, True])
def test_a_request_read_from_columns_is_the_checked_constructor_s(sessions):
    """The columns build each request field by field without `Request.__post_init__` (they were checked
    whole): every field is set, to what the checked constructor gives."""
    table = RequestTable(np.array([0.5, 0.1, 0.3]), np.array([4, 7, 2]), np.array([3, 1, 5]),
                         content=[(Segment(11, 4),), (Segment(22, 7),), (Segment(22, 1), Segment(33, 1))]
                         if sessions else None, session_id=["a", None, "b"] if sessions else None)
    for r in finalize(table, seed=0):
        checked = Request(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.content, r.n,
                          r.beam_width, r.session_id)
        assert [getattr(r, f.name) for f in dataclasses.fields(Request)] == \
            [getattr(checked, f.name) for f in dataclasses.fields(Request)]
        assert all(type(getattr(r, f)) is type(getattr(checked, f)) for f in ("request_id", "arrival_s",
                                                                               "prompt_tokens", "output_tokens"))


def test_columns_refuse_a_request_the_constructor_refuses():
    with pytest.raises(ValueError, match="request 1: output_tokens must be >= 1, got 0"):
        finalize(RequestTable(np.array([0.0, 1.0]), np.array([4, 7]), np.array([3, 0])), seed=0)
    with pytest.raises(ValueError, match="content covers 3 tokens, prompt has 4"):
        finalize(RequestTable(np.array([0.0]), np.array([4]), np.array([3]), content=[(Segment(1, 3),)]), seed=0)
