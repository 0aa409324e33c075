"""Random garbage lines give either a WorkloadError or a valid workload, never anything else."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.config import RunConfig
from workbench.errors import WorkloadError
from workbench.workload import build_workload

HEADERS = {
    "azure": "TIMESTAMP,ContextTokens,GeneratedTokens",
    "burstgpt": "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type",
    "lengths": "input_tokens,output_tokens",
    "mooncake": "",
}
GOOD_LINES = {
    "azure": ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:47,3,1"],
    "burstgpt": ["5,s1,3,ChatGPT,472,18,490,Conversation log", "9,s1,3,GPT-4,600,0,600,API log", "9,,1,x,1,1,2,y"],
    "lengths": ["21,518", "8,66", "0,0"],
    "mooncake": ['{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}',
                 '{"timestamp": 10, "input_length": 30, "output_length": 0, "hash_ids": [0]}'],
}
ALPHABET = "0123456789,.-:e\"' {}[]aNn\t_"

garbage = st.text(alphabet=ALPHABET, max_size=40)


def _check_valid(requests):
    assert [r.request_id for r in requests] == list(range(len(requests)))
    arrivals = [r.arrival_s for r in requests]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    for r in requests:
        assert r.prompt_tokens >= 1 and r.output_tokens >= 1
        assert sum(s.length for s in r.content) == r.prompt_tokens


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(sorted(HEADERS)), data=st.data())
def test_garbage_lines(fmt, data):
    pool = st.one_of(garbage, st.sampled_from(GOOD_LINES[fmt]))
    lines = data.draw(st.lists(pool, min_size=0, max_size=6))
    text = "\n".join(([HEADERS[fmt]] if HEADERS[fmt] else []) + lines) + data.draw(st.sampled_from(["", "\n"]))
    options = data.draw(st.sampled_from(["", ":failed=keep"]))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.txt"
        path.write_text(text)
        try:
            requests = build_workload(RunConfig(workload=f"{fmt}:{path}{options}"))
        except WorkloadError as err:
            assert err.file == str(path)
            return
    _check_valid(requests)


@settings(max_examples=60, deadline=None)
@given(fmt=st.sampled_from(sorted(HEADERS)), blob=st.binary(max_size=200))
def test_random_bytes(fmt, blob):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.bin"
        path.write_bytes(blob)
        try:
            requests = build_workload(RunConfig(workload=f"{fmt}:{path}"))
        except WorkloadError:
            return
    _check_valid(requests)


@pytest.mark.parametrize("fmt", sorted(f for f in HEADERS if HEADERS[f]))
def test_rows_with_one_field_more_than_the_header_are_refused(fmt, tmp_path):
    """pandas would take each row's first field as an index and shift the rest into the header's columns."""
    path = tmp_path / "trace.csv"
    path.write_text("\n".join([HEADERS[fmt]] + [f"7,{line}" for line in GOOD_LINES[fmt]]) + "\n")
    with pytest.raises(WorkloadError, match="as many fields as the header"):
        build_workload(RunConfig(workload=f"{fmt}:{path}"))
