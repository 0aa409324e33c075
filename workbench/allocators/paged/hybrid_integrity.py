"""`check_integrity` of the hybrid pool (`allocators.hybrid`): every invariant recomputed from its tables.

It reads the pool's parts without importing its class, so `hybrid` can import it (no import cycle).
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.paged.integrity import first_repeating_segment
from workbench.intmath import cdiv


def check_hybrid(pool) -> None:
    """Raise AssertionError naming the first broken invariant of `pool` (a `HybridPaged`). Pure."""
    holders = np.zeros(pool.num_blocks, dtype=np.int64)  # [num_blocks]
    owner = np.full(pool.num_blocks, -1, dtype=np.int64)  # [num_blocks]: the group holding each block
    tables: list[tuple[int, int, np.ndarray]] = []  # (group, sequence, the blocks it holds) of every table
    for gi, g in enumerate(pool.groups):
        assert set(pool.seqs.ids()) == g.entries.keys(), f"group {gi}: tables of other sequences than the rows'"
        for seq_id, table in g.entries.items():
            length, row = pool.length(seq_id), pool.seqs.row(seq_id)
            assert len(table) == cdiv(length, pool.block_size), f"group {gi} seq {seq_id}: table length"
            first = int(g.first_live[row])
            # released at appends, each before a token was added (or never held after a prefix hit, before
            # the first computed query's window): never past what length − 1 allows
            assert first <= g.dead_before(length - 1), f"group {gi} seq {seq_id}: a live block released"
            assert all(e is None for e in table[:first]), f"group {gi} seq {seq_id}: released run broken"
            assert g.last[row] == int(table[-1][0]), f"group {gi} seq {seq_id}: its last block recorded wrong"
            held = g.held_blocks(seq_id)
            assert held.shape[0] == (len(table) - first) * g.units, f"group {gi} seq {seq_id}: entry shape"
            tables.append((gi, seq_id, held))
            holders[held] += 1
            assert np.all((owner[held] == -1) | (owner[held] == gi)), "a block in two groups' tables"
            owner[held] = gi
            assert length <= pool.final_len(seq_id) <= pool.max_model_len, f"seq {seq_id}: length bounds"
    if tables:
        held_lists = [held for _, _, held in tables]
        twice = first_repeating_segment(np.concatenate(held_lists), np.array([h.shape[0] for h in held_lists]),
                                        pool.num_blocks)
        assert twice is None, f"group {tables[twice][0]} seq {tables[twice][1]}: a block twice"
    assert np.array_equal(holders, pool.refcount), "refcounts differ from the tables"
    held = owner >= 0
    assert np.array_equal(pool.group_of_block()[held], owner[held]), "a held block's group is recorded wrong"
    held_per_group = np.bincount(owner[held], minlength=len(pool.groups)).tolist()
    assert pool.held_blocks() == held_per_group, f"held blocks per group {pool.held_blocks()}, not {held_per_group}"
    _check_shared_fills(pool)
    free = pool.free_block_ids()
    assert not free.shape[0] or np.bincount(free).max() <= 1, "a block twice on the free stack"
    assert not np.any(pool.refcount[free]), "a held block is on the free stack"
    cached = 0 if pool.prefix is None else pool.prefix.cached_blocks
    assert free.shape[0] + np.count_nonzero(pool.refcount) + cached == pool.num_blocks, "a block is lost"
    if pool.prefix is not None:
        pool.prefix.check_integrity(pool.refcount, free, owner)


def _check_shared_fills(pool) -> None:
    """Every holder of an entry sees the same written slots in it (writers into shared blocks copy)."""
    bs = pool.block_size
    for gi, g in enumerate(pool.groups):
        fill: dict[int, int] = {}
        for seq_id, table in g.entries.items():
            length = pool.length(seq_id)
            for i in range(int(g.first_live[pool.seqs.row(seq_id)]), len(table)):
                seen = fill.setdefault(int(table[i][0]), min(length - i * bs, bs))
                assert seen == min(length - i * bs, bs), f"group {gi}: a shared block's fill differs"
