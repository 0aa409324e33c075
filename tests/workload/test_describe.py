"""The describer: exact prefix-sharing potential against a token-level reference, and the printed summary."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.config import RunConfig
from workbench.workload import Request, Segment, load_workload, output_key
from workbench.workload.__main__ import main
from workbench.workload.describe import describe, peak_rate, prefix_sharing
from workbench.workload.request import content_token_ids


def _req(i, content, output=5):
    return Request(i, float(i), sum(s.length for s in content), output, tuple(content))


def test_identical_prompts_hit_their_full_blocks():
    a, b = _req(0, [Segment(7, 40)]), _req(1, [Segment(7, 40)])
    assert prefix_sharing([a, b], 16).hit_tokens == 32


def test_the_infinite_cache_bound_always_computes_one_prompt_token():
    a, b = _req(0, [Segment(7, 32)]), _req(1, [Segment(7, 32)])
    sharing = prefix_sharing([a, b], 16)
    assert (sharing.hit_tokens, sharing.bound_tokens) == (32, 16)  # the second block holds the last token
    assert prefix_sharing([a, b], 1).bound_tokens == 31
    c = _req(2, [Segment(7, 32), Segment(9, 1)])  # one more token: both blocks hit
    assert prefix_sharing([a, c], 16).bound_tokens == 32


def test_a_prefix_ending_inside_a_segment():
    a, b = _req(0, [Segment(7, 40)]), _req(1, [Segment(7, 20), Segment(8, 20)])
    assert prefix_sharing([a, b], 16).hit_tokens == 16
    assert prefix_sharing([a, b], 4).hit_tokens == 20


def test_a_later_turn_hits_the_earlier_answer():
    a = _req(0, [Segment(7, 10)], output=30)
    b = _req(1, [Segment(7, 10), Segment(output_key(0, 0), 30), Segment(9, 8)])
    sharing = prefix_sharing([a, b], 16)
    assert (sharing.hit_tokens, sharing.prompt_tokens) == (32, 58)


def _reference(requests, block_size):
    """Materialize every token; a prompt block hits when its whole token prefix was a full block before."""
    seen: set[bytes] = set()
    hits = 0
    for r in requests:
        tokens = np.concatenate([content_token_ids(r.content),
                                 content_token_ids((Segment(r.output_key, r.output_tokens),))])
        ends = range(block_size, len(tokens) + 1, block_size)
        hits += sum(block_size for e in ends if e <= r.prompt_tokens and tokens[:e].tobytes() in seen)
        seen.update(tokens[:e].tobytes() for e in ends)
    return hits


segments = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40)), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(specs=st.lists(st.tuples(segments, st.integers(1, 30), st.booleans()), min_size=1, max_size=6),
       block_size=st.sampled_from([2, 3, 8, 16]))
def test_matches_a_token_level_reference(specs, block_size):
    requests = []
    for i, (segs, output, quote) in enumerate(specs):
        content = [Segment(k, n) for k, n in segs]
        if quote and i:  # quote the previous request's whole sequence, as a later turn does
            prev = requests[-1]
            content = [*prev.content, Segment(prev.output_key, prev.output_tokens), *content]
        requests.append(_req(i, content, output))
    sharing = prefix_sharing(requests, block_size)
    assert sharing.hit_tokens == _reference(requests, block_size)
    assert sharing.prompt_tokens == sum(r.prompt_tokens for r in requests)


@pytest.mark.parametrize("block_size", [1, 2, 16, 64, 512])
def test_mooncake_content_shares_the_same_at_every_block_size_dividing_512(tmp_path, block_size):
    lines = ['{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [0, 1]}',
             '{"timestamp": 1, "input_length": 1536, "output_length": 5, "hash_ids": [0, 1, 2]}',
             '{"timestamp": 2, "input_length": 1024, "output_length": 5, "hash_ids": [0, 3]}',
             '{"timestamp": 3, "input_length": 512, "output_length": 5, "hash_ids": [4]}']
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(lines) + "\n")
    requests = load_workload(RunConfig(workload=f"mooncake:{path}")).requests
    sharing = prefix_sharing(requests, block_size)
    assert (sharing.hit_tokens, sharing.prompt_tokens) == (1536, 4096)


def test_peak_rate_bins():
    arrival_s = np.array([0.0, 0.1, 0.2, 1.5, 61.0])
    assert peak_rate(arrival_s, 1.0) == 3.0
    assert peak_rate(arrival_s, 60.0) == pytest.approx(4 / 60)


def test_summary_numbers():
    wl = load_workload(RunConfig(workload="fixed:prompt=100,output=20", num_requests=200, rate=4.0))
    text = describe(wl)
    span = wl.requests[-1].arrival_s
    assert "requests        200\n" in text
    assert f"time span       {span:,.1f} s" in text
    assert f"mean rate       {200 / span:.3f} req/s" in text
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.startswith("  ")}
    assert rows["prompt"] == ["100.00", "100", "100", "100", "100", "20,000"]
    assert rows["output"] == ["20.00", "20", "20", "20", "20", "4,000"]
    assert "prefix sharing  0.0% of prompt tokens (0 of 20,000)" in text and "block size 16" in text


def test_cli_describe(capsys):
    assert main(["describe", "system-prompt:k=2,system=64", "--num-requests", "50", "--block-size", "32"]) == 0
    out = capsys.readouterr().out
    wl = load_workload(RunConfig(workload="system-prompt:k=2,system=64", num_requests=50))
    hit = prefix_sharing(wl.requests, 32)
    assert f"({hit.hit_tokens:,} of {hit.prompt_tokens:,})" in out and "block size 32" in out
    assert hit.hit_tokens == 64 * 48  # all but the first user of each system prompt hit both 32-token blocks


@pytest.mark.parametrize("cv", [1.0, 3.0])
def test_summary_reports_burstiness(cv):
    wl = load_workload(RunConfig(workload=f"alpaca-like:cv={cv}", num_requests=20_000, seed=3))
    line = next(x for x in describe(wl).splitlines() if x.startswith("burstiness"))
    assert float(line.split("CV ")[1].split()[0]) == pytest.approx(cv, rel=0.1)
