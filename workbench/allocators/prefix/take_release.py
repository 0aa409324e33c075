"""A hash-chain prefix cache's taking and giving back of blocks, each in one compiled call.

`PrefixCacheStrategy._take` takes never-cached free blocks first and evicts cached ones, least recently used
first, only when none is left; `_release` hands a finished sequence's blocks to the index, which keeps the
registered ones as cache (the tail first, so it is evicted before the head) and returns the others to the free
stack. Under LRU eviction with the hash index alone (`PrefixCacheStrategy`'s `_one_call`), each is the functions
below over the index's, the LRU order's and the free stack's own arrays; the decode append
(`prefix.decode_append`) takes its blocks with `take_evicting` too.
"""

from __future__ import annotations

from numba import njit

from workbench.allocators.paged.block_stack import pop_blocks, push_blocks
from workbench.allocators.prefix import key_table, lru_list


@njit(cache=True)
def take_evicting(taken, free_ids, free_size, prev, nxt, queued, last_use, ends, slot_key, slot_block, next_copy,
                  registered, key_of):
    """Mutates. Fill `taken` with blocks: the top of the free stack `free_ids[:free_size]` first, then cached blocks
    evicted least recently used first, their keys leaving the table. Returns (blocks from the free stack, keys the
    table lost). The caller sees that enough blocks are free or cached."""
    k = taken.shape[0]
    from_free = min(k, free_size)
    taken[:from_free] = pop_blocks(free_ids, free_size, from_free)
    lost = 0
    if k > from_free:
        victims = taken[from_free:]
        lru_list.pop_victims(prev, nxt, queued, last_use, ends, victims)
        lost = key_table.remove(slot_key, slot_block, next_copy, registered, key_of, victims)
    return from_free, lost


@njit(cache=True)
def release_to_cache(blocks, registered, prev, nxt, queued, last_use, ends, free_ids, free_size, scratch):
    """Mutates. `blocks` (a sequence's released blocks, head first) leave the sequence: the registered ones join
    the LRU order tail first (`HashPrefixIndex.release`), the others go on the free stack with the first of them
    on top (`BlockStack.push`). `scratch` holds at least `blocks.shape[0]`. Returns the free stack's size."""
    n = 0
    for j in range(blocks.shape[0] - 1, -1, -1):
        if registered[blocks[j]]:
            scratch[n] = blocks[j]
            n += 1
    lru_list.add_many(prev, nxt, queued, last_use, ends, scratch[:n])
    n = 0
    for j in range(blocks.shape[0]):
        if not registered[blocks[j]]:
            scratch[n] = blocks[j]
            n += 1
    return push_blocks(free_ids, free_size, scratch, n)
