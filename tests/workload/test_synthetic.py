"""Synthetic workloads: seeded, sorted, within limits, with the documented distributions and sharing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.config import RunConfig
from workbench.workload import Segment, build_workload, output_key
from workbench.workload.distributions import arrival_times_s

NAMES = ["sharegpt-like", "alpaca-like", "fixed:prompt=100,output=20", "system-prompt:k=3,system=300",
         "multi-turn:turns=5,think=4", "multi-turn:turns=5,lengths=sharegpt,history=600", "sharegpt-like:cv=3"]


def _invariants(requests, max_model_len=2048):
    assert [r.request_id for r in requests] == list(range(len(requests)))
    arrivals = np.array([r.arrival_s for r in requests])
    assert arrivals[0] == 0.0 and np.all(np.diff(arrivals) >= 0)
    for r in requests:
        assert r.prompt_tokens + r.output_tokens <= max_model_len
        assert sum(s.length for s in r.content) == r.prompt_tokens


@pytest.mark.parametrize("name", NAMES)
def test_seeded_sorted_and_within_limits(name):
    cfg = RunConfig(workload=name, rate=3.0, seed=7)
    a, b = build_workload(cfg), build_workload(cfg)
    assert a == b and len(a) == 1000
    _invariants(a)
    assert build_workload(RunConfig(workload=name, rate=3.0, seed=8)) != a


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(NAMES), seed=st.integers(0, 2**32), num=st.integers(1, 300),
       max_model_len=st.sampled_from([700, 1024, 2048, 4096]), n=st.sampled_from([1, 2, 4]))
def test_any_seed_and_limit(name, seed, num, max_model_len, n):
    requests = build_workload(RunConfig(workload=name, seed=seed, num_requests=num, max_model_len=max_model_len, n=n))
    assert len(requests) == num and all(r.n == n and r.beam_width == 1 for r in requests)
    _invariants(requests, max_model_len)


@pytest.mark.parametrize("name,prompt_mean,output_mean", [("sharegpt-like", 161.31, 337.99),
                                                          ("alpaca-like", 19.31, 58.45)])
def test_length_means_match_the_paper(name, prompt_mean, output_mean):
    requests = build_workload(RunConfig(workload=name, num_requests=200_000, seed=1, rate=100.0))
    prompt = np.array([r.prompt_tokens for r in requests])
    output = np.array([r.output_tokens for r in requests])
    assert prompt.mean() == pytest.approx(prompt_mean, rel=0.03)
    assert output.mean() == pytest.approx(output_mean, rel=0.02)


def test_fixed_lengths():
    requests = build_workload(RunConfig(workload="fixed:prompt=128,output=64", num_requests=50))
    assert {(r.prompt_tokens, r.output_tokens) for r in requests} == {(128, 64)}
    assert len({r.content[0].key for r in requests}) == 50


@pytest.mark.parametrize("cv", [1.0, 3.0])
def test_arrivals_rate_and_burstiness(cv):
    times = arrival_times_s(np.random.default_rng(5), 4.0, cv, num=200_000)
    gaps = np.diff(times)
    assert times[0] == 0.0
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


def test_duration_generates_every_arrival_in_the_window():
    counts = [len(build_workload(RunConfig(workload="fixed", rate=5.0, duration=200.0, seed=s))) for s in range(30)]
    assert np.mean(counts) == pytest.approx(1000, rel=0.03)
    requests = build_workload(RunConfig(workload="fixed", rate=5.0, duration=200.0))
    assert requests[-1].arrival_s < 200.0


def test_system_prompt_shares_exactly_the_system_part():
    requests = build_workload(RunConfig(workload="system-prompt:k=3,system=300", num_requests=300, seed=2))
    system_keys = {r.content[0].key for r in requests}
    assert len(system_keys) == 3
    assert all(r.content[0].length == 300 and len(r.content) == 2 for r in requests)
    assert len({r.content[1].key for r in requests}) == 300
    first = {r.content[0].key: r.prompt_token_ids()[:300] for r in requests}
    for r in requests:
        assert np.array_equal(r.prompt_token_ids()[:300], first[r.content[0].key])


def test_multi_turn_prompts_contain_earlier_turns_and_answers():
    requests = build_workload(RunConfig(workload="multi-turn:turns=4,lengths=sharegpt", num_requests=400, seed=4))
    by_session: dict[str, list] = {}
    for r in requests:
        by_session.setdefault(r.session_id, []).append(r)
    assert max(len(turns) for turns in by_session.values()) == 4
    for turns in by_session.values():
        for prev, turn in zip(turns, turns[1:], strict=False):
            assert turn.arrival_s > prev.arrival_s
            k = len(prev.content)
            assert turn.content[:k] == prev.content
            assert turn.content[k] == Segment(output_key(prev.request_id, 0), prev.output_tokens)
            assert turn.content[k] == Segment(prev.output_key, prev.output_tokens)
            assert turn.prompt_tokens > prev.prompt_tokens + prev.output_tokens
            assert np.array_equal(turn.prompt_token_ids()[: prev.prompt_tokens], prev.prompt_token_ids())


def test_a_chatbot_history_cuts_long_prompts_to_their_last_tokens():
    cut = build_workload(RunConfig(workload="multi-turn:turns=6,lengths=sharegpt,history=1024", num_requests=600,
                                   seed=4))
    full = build_workload(RunConfig(workload="multi-turn:turns=6,lengths=sharegpt", num_requests=600, seed=4))
    # the same draws: the first turns, too short to cut and answered within max_model_len - history, agree
    assert cut[0].arrival_s == full[0].arrival_s and cut[0].content == full[0].content
    by_session: dict[str, list] = {}
    for r in cut:
        by_session.setdefault(r.session_id, []).append(r)
    earlier_keys: set[int] = set()
    num_cut = 0
    for turns in by_session.values():
        for prev, turn in zip(turns, turns[1:], strict=False):
            assert turn.output_tokens <= 2048 - 1024 and turn.prompt_tokens <= 1024
            if turn.content[:len(prev.content)] == prev.content:  # the whole conversation fits
                assert prev.prompt_tokens + prev.output_tokens < turn.prompt_tokens
            else:  # cut to its last 1,024 tokens: one segment sharing no leading block with any turn
                num_cut += 1
                assert turn.prompt_tokens == 1024 and len(turn.content) == 1
                assert turn.content[0].key not in earlier_keys
            earlier_keys |= {s.key for s in prev.content}
    assert num_cut > len(cut) / 3


def test_n_and_beam_width_apply_to_every_request():
    assert {r.beam_width for r in build_workload(RunConfig(workload="alpaca-like", beam_width=4))} == {4}
    assert {r.n for r in build_workload(RunConfig(workload="alpaca-like", n=6))} == {6}
