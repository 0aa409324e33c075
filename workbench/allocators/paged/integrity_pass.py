"""The paged pool's invariants recomputed in one compiled pass (workbench.allocators.paged.integrity words them).

`check_pool` reads the tables and the id lists as they are, recounts every holder, fill and free block from
them and returns the first invariant that does not hold, in a fixed order, as a code (0: all hold) and the row
it names (-1: none). The tests run it after every operation of their walks and every engine step, so it is one
pass over the rows and one over each id list, not one array operation per invariant.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from workbench.intmath import cdiv

# what broke, in the order the invariants are checked (the first that breaks is the one returned)
(OK, NO_TOKEN, LENGTH_ORDER, TABLE_LENGTH, TABLE_WIDTH, LAST_BLOCK, OUTSIDE, TWICE, DEVICE_REFCOUNT, HOST_REFCOUNT,
 FILL_DISAGREE, REGISTERED_OUTSIDE, REGISTERED_NOT_FULL, WRITTEN, LOGICAL, ENTRIES, FREE_OUTSIDE, FREE_TWICE,
 CACHED_OUTSIDE, STATE_OUTSIDE, STATE_IN_TABLE, PARTITION, HOST_FREE_OUTSIDE, HOST_PARTITION) = range(24)


@njit(cache=True)
def _row_fault(row, length, final_len, num_blocks, last_block, table, bs, max_model_len) -> int:
    """The first of the per-row invariants that row `row` breaks, OK when none."""
    n = length[row]
    if n < 1:
        return NO_TOKEN
    if not (n <= final_len[row] <= max_model_len):
        return LENGTH_ORDER
    nb = num_blocks[row]
    if nb != cdiv(n, bs):
        return TABLE_LENGTH
    if row >= table.shape[0] or nb > table.shape[1]:
        return TABLE_WIDTH
    if last_block[row] != table[row, nb - 1]:
        return LAST_BLOCK
    return OK


@njit(cache=True)
def _outside(ids, size) -> bool:
    for b in ids:
        if b < 0 or b >= size:
            return True
    return False


@njit(cache=True)
def _tally(ids, listed) -> bool:
    """Mutates `listed`: one more for each id of `ids`, unless some id lies outside it (then False, unchanged)."""
    if _outside(ids, listed.shape[0]):
        return False
    for b in ids:
        listed[b] += 1
    return True


@njit(cache=True)
def _entry_fill(j, nb, length, bs):
    """The slots a row of `length` tokens in `nb` blocks has written into its entry j."""
    return bs if j < nb - 1 else length - (nb - 1) * bs


@njit(cache=True)
def _not_a_partition(listed, holders) -> bool:
    """Whether some block is not in exactly one place: held (`holders` > 0) or listed (`listed` times)."""
    for b in range(listed.shape[0]):
        if listed[b] + (holders[b] > 0) != 1:
            return True
    return False


@njit(cache=True)
def check_pool(live, length, final_len, num_blocks, last_block, swapped, table, bs, max_model_len, refcount,
               host_refcount, free_ids, host_free_ids, cached_ids, registered_ids, state_ids, written_slots,
               logical_slots, table_entries):
    """Pure. (code, row): the first broken invariant and the row it names, (OK, -1) when all hold. `live` bool
    [rows], the per-row columns and `table` int32 [rows, width] are the tables' (`BlockTables`); a swapped-out
    row's entries are host blocks; `refcount` int32 [num_blocks] and `host_refcount` [num_host_blocks] the holder
    counts; the id lists int64 (free stack, host free stack, cached = evictable prefix blocks, registered prefix
    blocks, recurrent-state blocks); the counters the strategy's running written slots, logical slots and table
    entries."""
    num_dev, num_host = refcount.shape[0], host_refcount.shape[0]
    rows = np.flatnonzero(live)
    # per row, each invariant over every row before the next: the smallest code any row breaks is the first
    worst = OK
    for row in rows:
        fault = _row_fault(row, length, final_len, num_blocks, last_block, table, bs, max_model_len)
        if fault != OK and (worst == OK or fault < worst):
            worst = fault
    if worst != OK:
        return worst, -1
    for row in rows:
        bound = num_host if swapped[row] == 1 else num_dev
        for j in range(num_blocks[row]):
            if table[row, j] < 0 or table[row, j] >= bound:
                return OUTSIDE, -1
    stamp = np.zeros(max(num_dev, num_host), dtype=np.int64)
    for k, row in enumerate(rows):
        for j in range(num_blocks[row]):
            b = table[row, j]
            if stamp[b] == k + 1:
                return TWICE, row
            stamp[b] = k + 1
    # holders, and one fill per device block: the last holder's, which every holder must agree with
    holders = np.zeros(num_dev, dtype=np.int64)
    host_holders = np.zeros(num_host, dtype=np.int64)
    fill = np.full(num_dev, -1, dtype=np.int64)
    entries = 0
    logical = 0
    for row in rows:
        nb = num_blocks[row]
        if swapped[row] == 1:
            for j in range(nb):
                host_holders[table[row, j]] += 1
            continue
        entries += nb
        logical += length[row]
        for j in range(nb):
            b = table[row, j]
            holders[b] += 1
            fill[b] = _entry_fill(j, nb, length[row], bs)
    for b in range(num_dev):
        if holders[b] != refcount[b]:
            return DEVICE_REFCOUNT, -1
    for b in range(num_host):
        if host_holders[b] != host_refcount[b]:
            return HOST_REFCOUNT, -1
    for row in rows:
        nb = num_blocks[row]
        if swapped[row] == 1:
            continue
        for j in range(nb):
            if fill[table[row, j]] != _entry_fill(j, nb, length[row], bs):
                return FILL_DISAGREE, row
    if _outside(registered_ids, num_dev):
        return REGISTERED_OUTSIDE, -1
    for b in registered_ids:
        if holders[b] > 0 and fill[b] != bs:
            return REGISTERED_NOT_FULL, -1
    written = 0
    for b in range(num_dev):
        if holders[b] > 0:
            written += fill[b]
    if written != written_slots:
        return WRITTEN, -1
    if logical != logical_slots:
        return LOGICAL, -1
    if entries != table_entries:
        return ENTRIES, -1
    # held, free, cached and state blocks: each block of the pool in exactly one
    state = np.zeros(num_dev, dtype=np.int64)
    if not _tally(free_ids, state):
        return FREE_OUTSIDE, -1
    for b in free_ids:
        if state[b] > 1:
            return FREE_TWICE, -1
    if not _tally(cached_ids, state):
        return CACHED_OUTSIDE, -1
    if _outside(state_ids, num_dev):
        return STATE_OUTSIDE, -1
    for b in state_ids:
        if holders[b] > 0:
            return STATE_IN_TABLE, -1
    _tally(state_ids, state)
    if _not_a_partition(state, holders):
        return PARTITION, -1
    host_state = np.zeros(num_host, dtype=np.int64)
    if not _tally(host_free_ids, host_state):
        return HOST_FREE_OUTSIDE, -1
    if _not_a_partition(host_state, host_holders):
        return HOST_PARTITION, -1
    return OK, -1
