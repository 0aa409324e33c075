"""With a cache that never evicts, `radix` and `paged-prefix` at block 1 hit exactly the infinite-cache
bound of a Mooncake sample, computed here from the trace's hash ids alone (no token content, no hash
chains): request i hits the longest run of leading hash blocks it shares with any earlier request,
in tokens (a shared last block counts up to the shorter cut), less the one prompt token always computed.
`python -m workbench.workload describe` reports the same bound, from the workload's segments."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.engine.conftest import simulate_checked, small_config
from tests.engine.golden import MOONCAKE_FIXTURE
from workbench.workload import build_workload
from workbench.workload.describe import prefix_sharing

HASH_BLOCK_TOKENS = 512  # the Mooncake traces' hash block (FAST'25 release README)
MODEL = "custom:layers=2,kv_heads=2,heads=4,head_dim=16,params_b=0.1,max_model_len=2048"
# ~1,400 steps over ~21k cached tokens at block 1: an integrity check per step would cost 40x the run
CHECK_EVERY_STEPS = 37


def _segments(row: dict) -> list[tuple[int, int]]:
    """(hash id, tokens) of each hash block of a prompt; the last is cut to the prompt's remainder."""
    ids, n = row["hash_ids"], row["input_length"]
    return [(h, min(HASH_BLOCK_TOKENS, n - HASH_BLOCK_TOKENS * j)) for j, h in enumerate(ids)]


def infinite_cache_hits(rows: list[dict]) -> list[int]:
    hits = []
    for i, row in enumerate(rows):
        best = 0
        for earlier in rows[:i]:
            shared = 0
            for (h, n), (g, m) in zip(_segments(row), _segments(earlier), strict=False):
                if h != g:
                    break
                shared += min(n, m)
                if n != m:  # one of the two ends inside this block
                    break
            best = max(best, shared)
        hits.append(min(best, row["input_length"] - 1))
    return hits


@pytest.mark.parametrize("strategy", ["paged-prefix", "radix"])
def test_a_never_evicting_cache_at_block_1_hits_the_bound_from_the_hash_ids(strategy):
    rows = [json.loads(line) for line in MOONCAKE_FIXTURE.read_text().splitlines() if line.strip()]
    rows = rows[:16]
    total = sum(r["input_length"] + r["output_length"] for r in rows)
    cfg = small_config(strategy=strategy, workload=f"mooncake:{MOONCAKE_FIXTURE}", num_requests=len(rows),
                       kv_slots=total + 64, model=MODEL, block_size=1, kernel="none", max_num_seqs=8)
    result = simulate_checked(cfg, every=CHECK_EVERY_STEPS)
    requests = result.requests.sort_values("request_id")
    assert int(result.summary["num_preemptions"]) == 0  # nothing was ever evicted or recomputed
    expected = infinite_cache_hits(rows)
    assert sum(expected) > 0
    assert prefix_sharing(build_workload(cfg), 1).bound_tokens == sum(expected)  # describe's bound
    assert requests["prefix_hit_tokens"].tolist() == expected
    assert np.all(result.steps["cached_slots"].to_numpy() >= 0)
