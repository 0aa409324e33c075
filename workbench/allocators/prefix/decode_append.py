"""A hash-chain prefix cache's decode append in one compiled call.

`PrefixCacheStrategy.append_if_room` takes a decode batch through five steps, each its own call: count the
blocks (`paged.loops.count_append`), take them (`prefix.take_release.take_evicting`: the free stack first,
then the least recently used cached blocks, whose keys leave the table), write the batch
(`paged.loops.apply_append`), advance each sequence's chain (`prefix.loops.append_terms`) and register the
blocks it filled (`prefix.key_table.insert`). Here the
same functions run in that order inside one call, for the case whose every step is one of them: the hash
index under LRU eviction, with neither a host or shared tier nor recurrent state (`PrefixCacheStrategy`'s
`_one_call`). Any other case keeps the step-by-step path.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from workbench.allocators.paged.loops import APPENDED, NO_ROOM, WIDEN, apply_append, count_append, last_two_blocks
from workbench.allocators.prefix import key_table, lru_list
from workbench.allocators.prefix.loops import append_terms
from workbench.allocators.prefix.take_release import take_evicting


@njit(cache=True)
def append_evicting(rows, token_ids, length, final_len, num_blocks, swapped, last_block, table, refcount, block_size,
                    scratch, row_mark, free_ids, free_size, prev, nxt, queued, last_use, ends, slot_key, slot_block,
                    next_copy, registered, key_of, salt, base, chain_key, tail_sum, known, slots, copies):
    """Returns (status, x, blocks from the free stack, blocks evicted, copies, slots copied, tables grown, keys the
    table gained less those it lost). status < 0: `check_batch`'s error, x the offending index; NO_ROOM: x blocks
    needed, fewer free and cached; WIDEN: the table needs x columns (nothing changed in those three); APPENDED:
    x blocks taken. The per-block arrays of the index must cover every block id, and its table have room for
    one new key per row (the caller sees to both)."""
    num_new, widest = count_append(rows, length, final_len, num_blocks, swapped, last_block, refcount, block_size,
                                   scratch, row_mark, False, True)
    if num_new < 0:
        return num_new, widest, 0, 0, 0, 0, 0, 0
    if num_new > free_size + ends[lru_list.LENGTH]:
        return NO_ROOM, num_new, 0, 0, 0, 0, 0, 0
    if widest > table.shape[1]:
        return WIDEN, widest, 0, 0, 0, 0, 0, 0
    # never-cached free blocks first, then cached ones evicted least recently used first (`_take`)
    taken = np.empty(num_new, dtype=np.int32)
    from_free, lost = take_evicting(taken, free_ids, free_size, prev, nxt, queued, last_use, ends, slot_key,
                                    slot_block, next_copy, registered, key_of)
    num_copies, copied_slots, grown = apply_append(rows, length, num_blocks, last_block, table, refcount, block_size,
                                                   taken, slots, copies, False)
    # the blocks this step filled, registered under their chain keys (`_register_filled`)
    filled_rows = np.empty(rows.shape[0], dtype=np.int64)
    filled_parents = np.empty(rows.shape[0], dtype=np.uint64)
    filled_keys = np.empty(rows.shape[0], dtype=np.uint64)
    n = append_terms(rows, length, token_ids, salt, base, chain_key, tail_sum, known, filled_rows, filled_parents,
                     filled_keys)
    filled = np.empty(n, dtype=np.int32)
    before = np.empty(n, dtype=np.int32)
    last_two_blocks(filled_rows[:n], table, num_blocks, filled, before)
    new = np.empty(n, dtype=np.bool_)
    gained = key_table.insert(slot_key, slot_block, next_copy, registered, key_of, filled_keys[:n], filled, new)
    return APPENDED, num_new, from_free, num_new - from_free, num_copies, copied_slots, grown, gained - lost
