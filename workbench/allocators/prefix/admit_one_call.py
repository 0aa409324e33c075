"""A hash-chain prefix cache's placement of an admitted prompt in one compiled call.

Once an admission is counted (`PagedStrategy._count_admission`: the prompt's keys, its hits, the fresh blocks
it needs), `PagedStrategy._place_admission` places it in steps, each its own call: the hits gain their holders
(leaving the LRU order first: `lru_list.claim_many`), the fresh blocks are taken (`take_release.take_evicting`:
the free stack first, then cached blocks least recently used first, whose keys leave the table), each
sequence's table row is filled with the hits and then the fresh blocks (`paged.loops.fill_row`), the new full
blocks are registered under their chain keys (`key_table.insert`) and each row's chain starts after the last
full block (`prefix.loops.start_rows`). Here the same functions run in that order inside one call, for the case
whose every step is one of them (`PrefixCacheStrategy`'s `_one_call`, as `prefix.decode_append` for a decode
step). Any other case keeps the step-by-step path.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from workbench.allocators.paged.loops import fill_row
from workbench.allocators.prefix import key_table, lru_list
from workbench.allocators.prefix.loops import start_rows
from workbench.allocators.prefix.take_release import take_evicting


@njit(cache=True)
def place_prompt(rows, hits, fresh, keys, num_full, num_tokens, final, token_ids, refcount, free_ids, free_size, table,
                 length, final_len, num_blocks, last_block, prev, nxt, queued, last_use, ends, slot_key, slot_block,
                 next_copy, registered, key_of, salt, chain_key, tail_sum, known):
    """Mutates. The rows (int64 [n], new and empty) hold `num_tokens` tokens of `token_ids` (int32), final length
    `final`, in the blocks `hits` (int32 [num_hit]) then `fresh` (int32 [need], filled here); the first
    `num_full` of the prompt's `keys` (uint64) name its full blocks. Returns (blocks from the free stack, keys
    the table gained less those it lost). The caller sees that the blocks can be had, that the tables have the
    rows and columns and the index's table room for the new keys, and that the per-block arrays cover every
    block id."""
    n = rows.shape[0]
    num_hit = hits.shape[0]
    if num_hit:  # the hits gain their holders first, so that taking fresh blocks cannot evict them
        lru_list.claim_many(prev, nxt, queued, last_use, ends, hits)
        for b in hits:
            refcount[b] += n
    from_free, lost = take_evicting(fresh, free_ids, free_size, prev, nxt, queued, last_use, ends, slot_key,
                                    slot_block, next_copy, registered, key_of)
    for b in fresh:
        refcount[b] = n
    blocks = np.empty(num_hit + fresh.shape[0], dtype=np.int32)
    blocks[:num_hit] = hits
    blocks[num_hit:] = fresh
    for r in rows:
        fill_row(r, blocks, num_tokens, final, table, length, final_len, num_blocks, last_block)
    new = np.empty(num_full - num_hit, dtype=np.bool_)
    gained = key_table.insert(slot_key, slot_block, next_copy, registered, key_of, keys[num_hit:num_full],
                              blocks[num_hit:num_full], new)
    last_key = keys[num_full - 1] if num_full else np.uint64(0)
    start_rows(rows, token_ids[:num_tokens], salt, last_key, chain_key, tail_sum, known)
    return from_free, gained - lost
