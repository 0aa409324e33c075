"""The compiled decode append (`paged.loops.count_append`, `apply_append`) against a plain Python statement of
its rules, over random tables: the batch check first (the first offending row), a new block where a row's last
block is full, a copy where a shared last block still has another holder when this writer comes (the k-th writer
copies iff k < refcount), and `sole_holders` or an empty slot mapping changing nothing else where no held block
has two holders."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.allocators.batch_check import PAST_FINAL, REPEATED, SWAPPED_OUT
from workbench.allocators.paged import loops

CAP_ROWS, NUM_BLOCKS = 48, 2000


def _pool(rng, shared: bool, block_size: int):
    """Random live rows with tables of ceil(length / block_size) blocks; with `shared`, some rows' tables are
    copies of others' (forks), so blocks have several holders."""
    length = np.zeros(CAP_ROWS, np.int64)
    final_len = np.zeros(CAP_ROWS, np.int64)
    num_blocks = np.zeros(CAP_ROWS, np.int64)
    last_block = np.zeros(CAP_ROWS, np.int64)
    table = np.zeros((CAP_ROWS, 64), np.int32)
    refcount = np.zeros(NUM_BLOCKS, np.int32)
    free = list(rng.permutation(NUM_BLOCKS))
    for r in range(CAP_ROWS):
        if shared and r and rng.random() < 0.4:  # a fork of an earlier row
            src = int(rng.integers(r))
            length[r], num_blocks[r] = length[src], num_blocks[src]
            table[r] = table[src]
        else:
            length[r] = int(rng.integers(1, 40 * block_size))
            num_blocks[r] = -(-length[r] // block_size)
            for j in range(num_blocks[r]):
                table[r, j] = free.pop()
        for j in range(num_blocks[r]):
            refcount[table[r, j]] += 1
        last_block[r] = table[r, num_blocks[r] - 1]
        final_len[r] = length[r] + (0 if rng.random() < 0.01 else int(rng.integers(1, 100)))
    swapped = (rng.random(CAP_ROWS) < 0.01).astype(np.int64)
    return length, final_len, num_blocks, last_block, table, refcount, swapped


def _reference_count(rows, length, final_len, num_blocks, swapped, last_block, refcount, block_size):
    """(blocks taken, widest table) or (negative status, index of the first offending row)."""
    seen, writers, num_new, widest = set(), {}, 0, 0
    for i, r in enumerate(rows.tolist()):
        if r in seen:
            return REPEATED, i
        if swapped[r]:
            return SWAPPED_OUT, i
        if length[r] >= final_len[r]:
            return PAST_FINAL, i
        seen.add(r)
        if length[r] % block_size == 0:
            num_new, widest = num_new + 1, max(widest, num_blocks[r] + 1)
            continue
        b = int(last_block[r])
        writers[b] = writers.get(b, 0) + 1
        num_new += int(refcount[b] > 1 and writers[b] < refcount[b])
        widest = max(widest, num_blocks[r])
    return num_new, widest


@pytest.mark.parametrize("block_size", [1, 16, 13])
@pytest.mark.parametrize("shared", [False, True])
def test_count_and_apply_follow_the_rules(shared, block_size):
    rng = np.random.default_rng(block_size + 100 * shared)
    for _ in range(150):
        length, final_len, num_blocks, last_block, table, refcount, swapped = _pool(rng, shared, block_size)
        size = int(rng.integers(1, CAP_ROWS))
        rows = rng.choice(CAP_ROWS, size=size, replace=False).astype(np.int64)
        if rng.random() < 0.1:  # a row twice
            rows = np.insert(rows, rng.integers(rows.shape[0] + 1), rows[rng.integers(rows.shape[0])])
        scratch, mark = np.zeros(NUM_BLOCKS, np.int64), np.zeros(CAP_ROWS, np.int64)
        expected = _reference_count(rows, length, final_len, num_blocks, swapped, last_block, refcount, block_size)
        sole_options = [False] if shared else [False, True]
        for sole in sole_options:
            got = loops.count_append(rows, length, final_len, num_blocks, swapped, last_block, refcount, block_size,
                                     scratch, mark, sole, True)
            assert got == expected
            assert not scratch.any() and not mark.any()
            if expected[0] >= 0:  # a valid batch counts the same unchecked
                unchecked = loops.count_append(rows, length, final_len, num_blocks, swapped, last_block, refcount,
                                               block_size, scratch, mark, sole, False)
                assert unchecked == expected
                assert not scratch.any() and not mark.any()
        if expected[0] < 0 or expected[1] > table.shape[1]:
            continue
        results = []
        for sole, want_slots in [(s, w) for s in sole_options for w in (True, False)]:
            state = [a.copy() for a in (length, num_blocks, last_block, table, refcount)]
            new_blocks = np.flatnonzero(state[4] == 0)[:expected[0]].astype(np.int32)
            slots = np.zeros(rows.shape[0] if want_slots else 0, np.int64)
            copies = np.zeros((rows.shape[0], 2), np.int32)
            out = loops.apply_append(rows, *state[:2], state[2], state[3], state[4], block_size, new_blocks, slots,
                                     copies, sole)
            assert (state[0][rows] == length[rows] + 1).all()
            assert (state[1] == -(-state[0] // block_size)).all()  # tables hold ceil(length / block_size) blocks
            holders = np.bincount(np.concatenate([state[3][r, :state[1][r]] for r in range(CAP_ROWS)]),
                                  minlength=NUM_BLOCKS)
            assert (holders == state[4]).all()
            if want_slots:  # each row's slot is its written position in its (now private) last block
                assert (slots // block_size == state[2][rows]).all()
                assert (slots % block_size == length[rows] % block_size).all()
            results.append((out, copies[:out[0]].tolist(), [a.tolist() for a in state]))
        assert results[0][0][0] == (expected[0] - int(np.sum(length[rows] % block_size == 0)))  # copies
        assert all(result == results[0] for result in results)  # with or without slots, and sole_holders


@pytest.mark.parametrize("block_size", [1, 16, 13])
def test_reserved_slots_with_sole_holders_are_the_general_count(block_size):
    """`reserved_slots`: a row's reserved slots are its last block's unwritten slots up to its final length,
    a shared last block counted once at its furthest-reaching holder; `sole_holders` skips only the lookups."""
    rng = np.random.default_rng(block_size)
    for shared in (False, True):
        for _ in range(100):
            length, final_len, num_blocks, last_block, table, refcount, swapped = _pool(rng, shared, block_size)
            live = rng.random(CAP_ROWS) < 0.9
            if shared:  # only live, on-device holders count
                refcount[:] = np.bincount(np.concatenate([table[r, :num_blocks[r]] for r in range(CAP_ROWS)
                                                          if live[r] and not swapped[r]] or [np.zeros(0, np.int32)]),
                                          minlength=NUM_BLOCKS)
            scratch = np.zeros(NUM_BLOCKS, np.int64)
            furthest: dict[int, int] = {}
            for r in np.flatnonzero(live & (swapped == 0)).tolist():
                start = (num_blocks[r] - 1) * block_size
                gap = min(final_len[r] - start, block_size) - (length[r] - start)
                furthest[int(last_block[r])] = max(furthest.get(int(last_block[r]), 0), gap)
            expected = sum(furthest.values())
            for sole in ([False] if shared else [False, True]):
                assert loops.reserved_slots(live, swapped, length, final_len, num_blocks, last_block, refcount,
                                            block_size, scratch, sole) == expected
                assert not scratch.any()
