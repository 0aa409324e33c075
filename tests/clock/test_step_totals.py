"""The step totals stated once for both step loops: the keys a causal prefill attends
(workbench.clock.step_cost.query_keys) and a paged pool's counters and internal fragmentation
(workbench.allocators.paged.pool_counts), each against its definition written out."""

from __future__ import annotations

import numpy as np

from workbench.allocators.paged import pool_counts
from workbench.clock.step_cost import query_keys


def test_query_keys_sums_one_plus_each_query_position():
    for start in range(0, 40):
        for stop in range(start, 60):
            assert query_keys(start, stop) == sum(q + 1 for q in range(start, stop))


def test_query_keys_over_arrays_is_elementwise_and_exact_past_int32():
    ctx = np.array([0, 7, 100_000, 3_000_000], dtype=np.int64)
    drafts = np.array([3, 0, 5, 4], dtype=np.int64)
    got = query_keys(ctx, ctx + drafts)
    pairs = zip(ctx.tolist(), drafts.tolist(), strict=True)
    assert got.tolist() == [sum(q + 1 for q in range(c, c + d)) for c, d in pairs]


def test_pool_counts_changes_are_inverse_pairs_and_frag_is_what_is_left():
    counts = pool_counts.new_counts()
    pool_counts.added(counts, 10, 3, 2, 4)  # three sequences of 10 tokens in 2 blocks each, 4 slots hit
    assert counts.tolist() == [6, 30, 6]
    pool_counts.appended(counts, 3, 5, 1)
    assert counts.tolist() == [6 + 3 + 5, 33, 7]
    pool_counts.released(counts, 14, 33, 7)
    assert counts.tolist() == [0, 0, 0]
    pool_counts.restored(counts, 4, 8, 1)
    pool_counts.released(counts, 4, 8, 1)
    assert not counts.any()
    assert pool_counts.internal_frag_slots(64, 40, 16, 4) == 4
