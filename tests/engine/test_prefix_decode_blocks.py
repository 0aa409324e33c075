"""`paged-prefix` in the engine: a multi-turn prompt hits the blocks the previous turn filled while
decoding, and the reused KV passes the kernel verification (verify_every=1)."""

from __future__ import annotations

import math

from tests.engine.conftest import checked_strategy, small_config
from workbench.engine import simulate
from workbench.workload import build_workload
from workbench.workload.request import Segment


def _previous_turn(requests, i):
    """The latest request whose prompt and answer open request i's prompt, or None."""
    q = requests[i]
    for p in reversed(requests[:i]):  # the latest turn: earlier turns of the session match too
        n = len(p.content)
        if q.content[:n + 1] == (*p.content, Segment(p.output_key, p.output_tokens)):
            return p
    return None


def test_next_turns_hit_the_previous_answer_blocks():
    cfg = small_config(strategy="paged-prefix", workload="multi-turn:turns=3,think=0.5,lengths=alpaca",
                       num_requests=12, kv_slots=4096, rate=4.0)  # a pool that never evicts here
    requests = build_workload(cfg)
    strategy = checked_strategy(cfg)
    result = simulate(cfg, requests, strategy)
    assert result.summary["num_finished"] == 12
    assert result.summary["verify_max_rel_err"] <= 1e-5
    table = result.requests.set_index("request_id")
    bs = cfg.block_size
    checked = 0
    for i, q in enumerate(requests):
        prev = _previous_turn(requests, i)
        if prev is None or not table.at[prev.request_id, "finish_s"] <= table.at[q.request_id, "admitted_s"]:
            continue
        # every full block of the previous turn's KV (its last generated token has none), up to the
        # last-token rule of the new prompt
        written = prev.prompt_tokens + prev.output_tokens - 1
        expected_blocks = min(written // bs, (q.prompt_tokens - 1) // bs)
        assert table.at[q.request_id, "prefix_hit_tokens"] == expected_blocks * bs, f"request {q.request_id}"
        assert written // bs > prev.prompt_tokens // bs  # the answer filled blocks of its own
        checked += 1
    assert checked >= 4

    # the same run without token ids on append hits only prompt blocks: strictly fewer hits
    without = checked_strategy(cfg)
    without.wants_token_ids = False  # the engine then passes no token ids to append
    before = simulate(cfg, requests, without)
    assert before.summary["verify_max_rel_err"] <= 1e-5
    assert strategy.prefix_hit_tokens > without.prefix_hit_tokens > 0
    assert not math.isnan(result.summary["prefix_hit_rate"])
