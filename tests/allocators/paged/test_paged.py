"""Scripted `paged` scenarios with exact block ids: admit, append, fork, copy-on-write, free, swap."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.allocators import registry
from workbench.allocators.values import SeqSpec


def paged(capacity_slots=64, block_size=4, max_model_len=100, swap_slots=0):
    return registry.create("paged", capacity_slots=capacity_slots, block_size=block_size,
                           max_model_len=max_model_len, swap_slots=swap_slots)


def spec(num_tokens, final_len, start=0):
    return SeqSpec(np.arange(start, start + num_tokens, dtype=np.int32), final_len)


def test_admit_takes_blocks_in_order_and_maps_slots():
    s = paged()
    assert s.admit([7], spec(10, 20)).admitted
    assert s.slot_mapping(7, 0, 10).tolist() == list(range(10))
    d = s.describe([7])
    assert d.kv_indptr.tolist() == [0, 3] and d.kv_indices.tolist() == [0, 1, 2]
    assert d.kv_last_page_len.tolist() == [2] and d.kv_indices.dtype == np.int32
    snap = s.snapshot()
    # 12 slots held: 10 written, 2 will be written (final 20 reaches past the block), none wasted
    assert (snap.token_slots, snap.reserved_slots, snap.internal_frag_slots, snap.free_slots) == (10, 2, 0, 52)
    assert snap.block_table_bytes == 3 * 4 and snap.num_free_blocks == 13


def test_slack_of_the_final_block_is_internal_fragmentation():
    s = paged()
    s.admit([1], spec(9, 10))  # blocks 0..2; the sequence ends at 10 tokens, inside block 2
    snap = s.snapshot()
    assert (snap.token_slots, snap.reserved_slots, snap.internal_frag_slots) == (9, 1, 2)


def test_append_across_a_block_boundary_takes_the_next_free_block():
    s = paged()
    s.admit([1], spec(8, 20))
    s.admit([2], spec(3, 20))  # block 2
    result = s.append([1, 2])
    assert result.slots.tolist() == [3 * 4 + 0, 2 * 4 + 3]  # seq 1 opens block 3; seq 2 fills block 2
    assert result.copies.shape == (0, 2)
    assert s.describe([1]).kv_indices.tolist() == [0, 1, 3]


def test_fork_shares_blocks_and_the_first_write_copies():
    s = paged()
    s.admit([1], spec(6, 20))  # blocks 0, 1 (block 1 holds 2 tokens)
    assert s.fork(1, 2).admitted
    assert s.describe([1, 2]).kv_indices.tolist() == [0, 1, 0, 1]
    assert s.snapshot().token_slots == 6 and s.snapshot().logical_token_slots == 12
    first = s.append([1])
    assert first.copies.tolist() == [[1, 2]]  # the writer gets block 2, a copy of shared block 1
    assert first.slots.tolist() == [2 * 4 + 2]
    second = s.append([2])  # now the last holder of block 1: writes in place, no copy
    assert second.copies.shape == (0, 2) and second.slots.tolist() == [1 * 4 + 2]
    assert s.describe([1, 2]).kv_indices.tolist() == [0, 2, 0, 1]
    s.check_integrity()


def test_free_returns_blocks_head_first():
    s = paged()
    s.admit([1], spec(10, 20))  # blocks 0, 1, 2
    s.admit([2], spec(1, 20))  # block 3
    s.free(1)
    s.admit([3], spec(5, 20))
    assert s.describe([3]).kv_indices.tolist() == [0, 1]
    s.check_integrity()


def test_shared_block_is_freed_only_by_its_last_holder():
    s = paged()
    s.admit([1, 2], spec(5, 20))
    s.free(1)
    assert s.snapshot().token_slots == 5
    s.free(2)
    snap = s.snapshot()
    assert snap.token_slots == 0 and snap.free_slots == 64


def test_append_that_cannot_be_served_raises_and_changes_nothing():
    s = paged(capacity_slots=8)
    s.admit([1, 2], spec(4, 20))  # block 0 shared, full; both need a new block, one is left
    assert not s.can_append([1, 2])
    before = s.snapshot()
    with pytest.raises(RuntimeError, match="out of blocks"):
        s.append([1, 2])
    assert s.snapshot() == before
    assert s.can_append([1])


def test_admission_refused_without_change():
    s = paged(capacity_slots=8)
    result = s.admit([1], spec(9, 20))
    assert not result.admitted and "needs 3 blocks" in result.reason and result.needed_extent_slots == 0
    assert s.snapshot().free_slots == 8


def test_swap_out_moves_each_distinct_block_once_and_swap_in_restores():
    s = paged(swap_slots=16)
    s.admit([1, 2], spec(6, 20))  # blocks 0, 1 shared by both
    s.admit([3], spec(2, 20))  # block 2
    assert s.can_swap_out([1, 2])
    out = s.swap_out([1, 2])
    assert out.moves.tolist() == [[0, 0], [1, 1]]
    snap = s.snapshot()
    assert snap.token_slots == 2 and snap.logical_token_slots == 2 and snap.free_slots == 64 - 4
    with pytest.raises(ValueError, match="swapped out"):
        s.append([1])
    back = s.swap_in([1, 2])
    assert back.moves.tolist() == [[0, 0], [1, 1]]  # released head first, so block 0 is on top again
    assert s.describe([1, 2]).kv_indices.tolist() == [0, 1, 0, 1]
    assert (s.swapped_out_blocks, s.swapped_in_blocks) == (2, 2)
    s.check_integrity()


def test_swap_needs_host_room():
    s = paged(swap_slots=4)
    s.admit([1], spec(6, 20))
    assert not s.can_swap_out([1])
    with pytest.raises(RuntimeError, match="out of blocks"):
        s.swap_out([1])
    s.check_integrity()


def test_capacity_is_whole_blocks():
    s = paged(capacity_slots=70, block_size=16)
    assert s.capacity_slots == 64 and s.snapshot().free_slots == 64


@pytest.mark.parametrize("bad", [dict(num_tokens=5, final_len=4), dict(num_tokens=5, final_len=101),
                                 dict(num_tokens=0, final_len=4)])
def test_impossible_lengths_are_refused_loudly(bad):
    with pytest.raises(ValueError):
        paged().admit([1], spec(bad["num_tokens"], bad["final_len"]))


def test_append_past_final_len_is_an_error():
    s = paged()
    s.admit([1], spec(3, 4))
    s.append([1])
    with pytest.raises(ValueError, match="past final_len"):
        s.append([1])


def test_unknown_and_repeated_ids_are_errors():
    s = paged()
    s.admit([1], spec(3, 10))
    with pytest.raises(KeyError, match="not live"):
        s.append([2])
    with pytest.raises(ValueError, match="repeats"):
        s.append([1, 1])
    with pytest.raises(ValueError, match="already live"):
        s.admit([1], spec(3, 10))


def test_tables_grow_past_their_initial_rows_and_columns():
    from tests.allocators.alloc_model import PoolModel

    rng = np.random.default_rng(3)
    s = paged(capacity_slots=300 * 128, block_size=2, max_model_len=200)
    model = PoolModel(s)
    ids = list(range(300))
    for i in ids:  # 300 rows (64 initially), 30..60-entry tables (16 columns initially)
        assert model.admit([i], rng.integers(0, 1000, int(rng.integers(60, 120))), 150).admitted
    for _ in range(5):
        model.append(ids, rng)
    model.verify()
    s.check_integrity()
    assert s.describe(ids).kv_indptr[-1] == sum(-(-len(model.tokens[i]) // 2) for i in ids)


def _healthy():
    """Shared, swapped and private blocks, and blocks on both free stacks: every part check_integrity reads."""
    s = paged(swap_slots=16)
    s.admit([1, 2], spec(6, 20))  # blocks 0, 1 shared
    s.admit([3], spec(5, 20))  # blocks 2, 3
    s.swap_out([1, 2])
    s.admit([4], spec(9, 20))
    s.check_integrity()
    return s


def _row(s, seq_id):
    return int(s.tables.seqs.rows([seq_id])[0])


def _repeat_first_block(s):
    row = _row(s, 4)  # three blocks: the middle one becomes the first again
    s.tables._table[row, 1] = s.tables._table[row, 0]


CORRUPTIONS = {
    "a row's last_block is not its last table entry":
        lambda s: s.tables.seqs.columns["last_block"].__setitem__(_row(s, 3), 99),
    "holds a block twice": _repeat_first_block,
    "a table entry is outside its pool": lambda s: s.tables._table.__setitem__((_row(s, 4), 0), s.num_blocks),
    "device refcounts differ": lambda s: s._refcount.__setitem__(int(s.describe([3]).kv_indices[0]), 2),
    "host refcounts differ": lambda s: s._host_refcount.__setitem__(0, 1 + int(s._host_refcount[0])),
    "token_slots counter differs": lambda s: s.counts.__setitem__(0, s.counts[0] + 1),
    "a table length is not ceil": lambda s: s.tables.seqs.columns["length"].__setitem__(_row(s, 4), 13),
    "not a partition of the pool": lambda s: s._free.push(np.array([int(s.describe([3]).kv_indices[0])], np.int32)),
    "not a partition of the host pool": lambda s: s._host_free.pop(1),
}


@pytest.mark.parametrize("what", CORRUPTIONS)
def test_check_integrity_names_each_broken_invariant(what):
    """The check every walk and engine test leans on catches each corruption, and says which invariant broke."""
    s = _healthy()
    CORRUPTIONS[what](s)
    with pytest.raises(AssertionError, match=what):
        s.check_integrity()
