"""Prefix caching on a hybrid pool, by hand: vLLM v1's hit rule with a window group whose early blocks
were released (and some evicted). Pool: 40 blocks of 4 slots, a window-8 group (group 0) beside a
full-attention group (group 1); a window group at a hit of n blocks needs blocks [n − cdiv(8 − 1, 4), n)
= [n − 2, n). Block ids are exact: a fresh pool pops 0, 1, 2, ... and a pushed block is popped next."""

from __future__ import annotations

import numpy as np

from workbench.allocators import registry
from workbench.allocators.values import SeqSpec

A = np.arange(100, 120, dtype=np.int32)  # 20 tokens: 5 full blocks
A_DECODE = np.arange(200, 204, dtype=np.int32)  # A's next 4 tokens fill its 6th block


def _pool():
    return registry.create_hybrid("paged-prefix", capacity_slots=40 * 4, block_size=4, max_model_len=200,
                                  groups=((8, 1), (None, 1)))


def _table(s, group: int, seq_id: int) -> list[int | None]:
    return [None if e is None else int(e[0]) for e in s.groups[group].entries[seq_id]]


def _run_a(s) -> None:
    """A: window blocks 0-4, full blocks 5-9; four decode steps. At length 20 the window releases blocks
    0-2 (positions < 20 − 8 + 1 = 13) and both groups take a block (10, 11); at length 23 block 3 goes."""
    assert s.admit([0], SeqSpec(A, 30)).cached_tokens == 0
    for token in A_DECODE:
        s.append([0], np.array([token], dtype=np.int32))
    assert _table(s, 0, 0) == [None, None, None, None, 4, 10]
    assert _table(s, 1, 0) == [5, 6, 7, 8, 9, 11]
    # released window blocks stay cached (tail first within each release), not lost
    assert [int(e[0]) for e in s.prefix.evictable_entries()] == [2, 1, 0, 3]
    assert s.snapshot().cached_slots == 4 * 4


def test_a_window_hit_holds_only_the_blocks_its_first_query_reads():
    s = _pool()
    _run_a(s)
    # B = A's 24 tokens + 2: at most 25 // 4 = 6 blocks hit. The full group has all 6; the window group
    # finds blocks 5 and 4 cached (held by A) from the right: a hit of 6 blocks, 24 tokens, holding
    # only [4, 6); its blocks 0-3 (cached, some evictable) are not needed.
    b = np.concatenate([A, A_DECODE, [7, 8]]).astype(np.int32)
    assert s.admit([1], SeqSpec(b, 40)).cached_tokens == 24
    assert _table(s, 0, 1) == [None, None, None, None, 4, 10, 12]
    assert _table(s, 1, 1) == [5, 6, 7, 8, 9, 11, 13]
    assert s.groups[0].first_live[s.seqs.row(1)] == 4
    assert s.prefix_hit_tokens == 24 and s.prefix_query_tokens == 20 + 26
    assert [int(e[0]) for e in s.prefix.evictable_entries()] == [2, 1, 0, 3]  # untouched by the hit
    s.check_integrity()


def test_the_window_group_shortens_the_hit_when_its_blocks_were_evicted():
    s = _pool()
    _run_a(s)
    s.free(0)  # group by group, each tail first: 10, 4 then 11, 9, 8, 7, 6, 5
    assert [int(e[0]) for e in s.prefix.evictable_entries()] == [2, 1, 0, 3, 10, 4, 11, 9, 8, 7, 6, 5]
    # D (unrelated, 15 blocks per group) takes the 28 free blocks and evicts window blocks 2 and 1
    d = np.arange(1000, 1060, dtype=np.int32)
    assert s.admit([1], SeqSpec(d, 60)).cached_tokens == 0
    assert s.prefix_evicted_blocks == 2
    # C = A's first 16 tokens + 4 new: the full group has blocks 0-3 cached (16 tokens), but the window
    # group finds no two consecutive cached blocks ending at 4, 3 or 2 (blocks 1 and 2 are gone): only
    # its leading run, block 0. The hit is 1 block, 4 tokens, in every group.
    c = np.concatenate([A[:16], [9, 9, 9, 9]]).astype(np.int32)
    assert s.admit([2], SeqSpec(c, 24)).cached_tokens == 4
    # the hits 0 and 5 are revived; the 8 fresh blocks evict, in LRU order, 3, 10, 4, 11 (window) and
    # 9, 8, 7, 6 (full), each popped last-pushed first
    assert _table(s, 0, 2) == [0, 11, 4, 10, 3]
    assert _table(s, 1, 2) == [5, 6, 7, 8, 9]
    assert s.prefix_evicted_blocks == 10
    snap = s.snapshot()
    assert snap.cached_slots == 0 and snap.free_slots == 0
    s.check_integrity()


def test_a_prompt_that_fits_in_the_window_needs_its_leading_run_only():
    """A window group reads blocks [n − 2, n) at a hit of n blocks: a 9-token prompt seen before hits its
    2 full blocks in both groups (the first computed query, at 8, reads positions 1-8). Its partial third
    blocks (2 and 5) were never registered: freed, they are the next popped (5, then 2)."""
    s = _pool()
    p = np.arange(50, 59, dtype=np.int32)  # 9 tokens
    s.admit([0], SeqSpec(p, 9))
    s.free(0)
    assert s.admit([1], SeqSpec(p, 12)).cached_tokens == 8
    assert _table(s, 0, 1) == [0, 1, 5] and _table(s, 1, 1) == [3, 4, 2]
    s.check_integrity()
