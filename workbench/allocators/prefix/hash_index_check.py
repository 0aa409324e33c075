"""The hash index's invariants recomputed in one compiled pass (`HashPrefixIndex.check_integrity` words them).

`check_index` reads the table, the per-block arrays and the evictable blocks as they are and returns the first
invariant that does not hold, in a fixed order, as a code (0: all hold) and two numbers it names. The tests
run it after every operation of their walks and every engine step.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from workbench.allocators.prefix.key_table import EMPTY, find

(OK, LISTED, NOT_REGISTERED_UNDER, LISTED_TWICE, SLOTS_HELD, UNREACHED, FREE_REGISTERED, EVICTABLE_TWICE,
 EVICTABLE_NOT_CACHED) = range(9)


@njit(cache=True)
def check_index(slot_key, slot_block, next_copy, registered, key_of, num_keys, refcount, free_ids, evictable):
    """Pure. (code, a, b): the first broken invariant and what it names, (OK, 0, 0) when all hold. The table
    (`key_table`: a key per held slot, its earliest block, later copies through `next_copy`) lists exactly the
    registered blocks, each once and under its own key; as many slots are held as keys are counted, each key
    once and reached by a probe from its home slot; no block on the free stack (`free_ids`, int64) is
    registered; the `evictable` blocks (int64) are distinct, registered and held by nobody (`refcount`)."""
    num_blocks = registered.shape[0]
    num_registered = 0
    for b in range(num_blocks):
        num_registered += registered[b]
    listed = 0
    seen = np.zeros(num_blocks, dtype=np.bool_)
    first_wrong_key, first_wrong_block = np.uint64(0), -1
    twice = False
    for s in range(slot_key.shape[0]):
        block = slot_block[s]
        while block != EMPTY and listed <= num_registered:
            listed += 1
            if first_wrong_block < 0 and (block >= num_blocks or not registered[block] or key_of[block] != slot_key[s]):
                first_wrong_key, first_wrong_block = slot_key[s], block
            if block < num_blocks:
                twice = twice or seen[block]
                seen[block] = True
            block = next_copy[block] if block < num_blocks else EMPTY
    if listed != num_registered:
        return LISTED, listed, num_registered
    if first_wrong_block >= 0:
        return NOT_REGISTERED_UNDER, np.int64(first_wrong_key), first_wrong_block
    if twice:
        return LISTED_TWICE, 0, 0
    held = 0
    for s in range(slot_key.shape[0]):
        held += slot_block[s] != EMPTY
    heads = np.empty(held, dtype=np.uint64)
    k = 0
    for s in range(slot_key.shape[0]):
        if slot_block[s] != EMPTY:
            heads[k] = slot_key[s]
            k += 1
    heads.sort()
    if held != num_keys or (held > 1 and np.any(heads[1:] == heads[:-1])):
        return SLOTS_HELD, held, num_keys
    for s in range(slot_key.shape[0]):
        if slot_block[s] != EMPTY and find(slot_key, slot_block, slot_key[s]) != s:
            return UNREACHED, np.int64(slot_key[s]), 0
    for b in free_ids:
        if b < num_blocks and registered[b]:
            return FREE_REGISTERED, b, 0
    bound = num_blocks
    for b in evictable:
        bound = max(bound, b + 1)
    on = np.zeros(bound, dtype=np.bool_)
    for b in evictable:
        if b >= 0:  # a negative id is not cached (below)
            if on[b]:
                return EVICTABLE_TWICE, b, 0
            on[b] = True
    for b in evictable:
        if b < 0 or b >= num_blocks or not registered[b] or refcount[b] != 0:
            return EVICTABLE_NOT_CACHED, b, 0
    return OK, 0, 0
