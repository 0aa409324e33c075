"""Each trace format read from small files written exactly like the published ones."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.config import RunConfig
from workbench.workload import Segment, build_workload, load_workload, output_key

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:50.9951690,879,55
"""

BURSTGPT1 = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,0,0,0,Conversation log
118,GPT-4,417,276,693,Conversation log
"""

BURSTGPT3 = """Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type
100.0,s1,43,GPT-4,100,50,150,Conversation log
101.0,s2,2,ChatGPT,36,29,65,Conversation log
130.0,s1,26,GPT-4,170,20,190,Conversation log
140.0,,3,ChatGPT,12,7,19,API log
150.0,s1,9,GPT-4,30,5,35,Conversation log
"""

MOONCAKE = """{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}
{"timestamp": 1500, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]}
{"timestamp": 3000, "input_length": 512, "output_length": 3, "hash_ids": [7]}
"""


def _build(tmp_path, fmt, text, name="trace.csv", **cfg):
    path = tmp_path / name
    path.write_text(text)
    return load_workload(RunConfig(workload=f"{fmt}:{path}", **cfg))


def test_azure_rows_become_requests_with_relative_arrivals(tmp_path):
    wl = _build(tmp_path, "azure", AZURE)
    assert [r.request_id for r in wl.requests] == [0, 1, 2]
    assert [(r.prompt_tokens, r.output_tokens) for r in wl.requests] == [(374, 44), (396, 109), (879, 55)]
    assert wl.requests[0].arrival_s == 0.0
    assert wl.requests[1].arrival_s == pytest.approx(4.314579)  # 100 ns ticks survive
    assert wl.requests[2].arrival_s == wl.requests[1].arrival_s
    keys = {seg.key for r in wl.requests for seg in r.content}
    assert len(keys) == 3 and all(len(r.content) == 1 for r in wl.requests)


def test_burstgpt_failed_rows_dropped_by_default_and_reported(tmp_path):
    wl = _build(tmp_path, "burstgpt", BURSTGPT1)
    assert [(r.prompt_tokens, r.output_tokens) for r in wl.requests] == [(472, 18), (417, 276)]
    assert [r.arrival_s for r in wl.requests] == [0.0, 113.0]
    assert any("dropped 1 failed rows" in note for note in wl.notes)


def test_burstgpt_failed_rows_kept_on_request(tmp_path):
    wl = _build(tmp_path, "burstgpt", BURSTGPT1, name="b.csv")
    path = tmp_path / "b.csv"
    kept = load_workload(RunConfig(workload=f"burstgpt:{path}:failed=keep"))
    assert len(kept.requests) == 3 == len(wl.requests) + 1
    assert (kept.requests[1].prompt_tokens, kept.requests[1].output_tokens) == (1, 1)
    assert any("kept 1 failed rows" in note for note in kept.notes)


def test_burstgpt_sessions_quote_the_previous_turn(tmp_path):
    wl = _build(tmp_path, "burstgpt", BURSTGPT3)
    r = wl.requests
    assert [x.session_id for x in r] == ["s1", "s2", "s1", None, "s1"]
    # turn 2 of s1: 170 tokens = turn 1's 100-token prompt + its 50-token answer + 20 new tokens
    assert r[2].content[: len(r[0].content)] == r[0].content
    assert r[2].content[len(r[0].content)] == Segment(output_key(0, 0), 50)
    assert r[2].content[-1].length == 20
    assert np.array_equal(r[2].prompt_token_ids()[:100], r[0].prompt_token_ids())
    # turn 3 of s1 is shorter than the history (the client truncated it): all new content
    assert len(r[4].content) == 1 and r[4].content[0].key not in {s.key for x in r[:4] for s in x.content}


def test_mooncake_hash_ids_expand_to_512_token_segments(tmp_path):
    wl = _build(tmp_path, "mooncake", MOONCAKE, name="m.jsonl")
    a, b, c = wl.requests
    assert [s.length for s in a.content] == [512, 488]
    assert [s.length for s in b.content] == [512, 512, 76]
    assert [r.arrival_s for r in wl.requests] == [0.0, 1.5, 3.0]
    ids_a, ids_b = a.prompt_token_ids(), b.prompt_token_ids()
    assert np.array_equal(ids_a, ids_b[:1000])  # equal hash ids = identical tokens, last block cut
    assert not np.array_equal(ids_b[:512], c.prompt_token_ids())


@pytest.mark.parametrize("header", ["prompt_tokens,output_tokens,input_tokens", "input_tokens,output_tokens",
                                    "num_prefill_tokens,num_decode_tokens", "ContextTokens,GeneratedTokens"])
def test_lengths_recognises_every_shared_column_pair(tmp_path, header):
    rows = "\n".join(f"{p},{o}" + (",999" if header.count(",") == 2 else "") for p, o in [(5, 7), (9, 11)])
    wl = _build(tmp_path, "lengths", f"{header}\n{rows}\n")
    assert sorted((r.prompt_tokens, r.output_tokens) for r in wl.requests) == [(5, 7), (9, 11)]


def test_lengths_filter_and_rate(tmp_path):
    rows = "\n".join(f"{p},{o}" for p, o in [(1000, 1000), (2000, 100), (10, 10)] * 200)
    path = tmp_path / "l.csv"
    path.write_text("input_tokens,output_tokens\n" + rows + "\n")
    wl = load_workload(RunConfig(workload=f"lengths:{path}", rate=4.0, seed=3))
    assert len(wl.requests) == 400  # 2000 + 100 > 2048 (opt-13b) is dropped
    assert any("dropped 200 of 600" in note for note in wl.notes)
    span = wl.requests[-1].arrival_s
    assert 399 / span == pytest.approx(4.0, rel=0.2)
    everything = build_workload(RunConfig(workload=f"lengths:{path}:filter=none"))
    assert len(everything) == 600
    longer = build_workload(RunConfig(workload=f"lengths:{path}", max_model_len=4096))
    assert len(longer) == 600


def test_trace_keeps_requests_longer_than_the_model(tmp_path):
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,5000,10\n"
    assert build_workload(RunConfig(workload=f"azure:{_write(tmp_path, text)}"))[0].prompt_tokens == 5000


def _write(tmp_path, text, name="t.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path
