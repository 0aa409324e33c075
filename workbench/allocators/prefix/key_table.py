"""The hash index's map from chain key to registered blocks, as arrays under compiled loops.

An open-addressing table (linear probing, a power-of-two number of slots, at most half full) maps each
key to the earliest block registered under it; later copies of the key (`hash_index`: the index does not
de-duplicate) hang off that block in registration order through `next_copy`. Deleting a key shifts the
entries that follow it back (no tombstones), so a probe stops at the first empty slot. A chain key is a
mixed 64-bit hash already, so its low bits pick the slot.

Every function is pure arithmetic on the arrays it is given: the owner (`hash_index.HashPrefixIndex`)
keeps them and grows them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

EMPTY = -1  # a slot's block when the slot holds no key; a block's `next_copy` when it is the last copy


def empty_slots(num_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """A table of `num_slots` (a power of two) empty slots: (slot_key uint64, slot_block int32)."""
    return np.zeros(num_slots, dtype=np.uint64), np.full(num_slots, EMPTY, dtype=np.int32)


@njit(cache=True)
def home(key, mask):
    """Pure. The slot a key's probe starts at: its low bits (a chain key is mixed already)."""
    return np.int64(key & np.uint64(mask))


@njit(cache=True)
def probe(slot_key, slot_block, key):
    """Pure. The slot holding `key`, else the empty slot where its probe from its home slot stops."""
    mask = slot_key.shape[0] - 1
    i = home(key, mask)
    while slot_block[i] != EMPTY and slot_key[i] != key:
        i = (i + 1) & mask
    return i


@njit(cache=True)
def find(slot_key, slot_block, key):
    """Pure. The slot holding `key`, or -1."""
    i = probe(slot_key, slot_block, key)
    return -1 if slot_block[i] == EMPTY else i


@njit(cache=True)
def lookup(slot_key, slot_block, keys, max_blocks, out):
    """Writes into `out` the earliest block of each of `keys[:max_blocks]` in order, up to the first key
    not held; returns how many."""
    n = min(max_blocks, keys.shape[0])
    for j in range(n):
        i = find(slot_key, slot_block, keys[j])
        if i < 0:
            return j
        out[j] = slot_block[i]
    return n


@njit(cache=True)
def insert(slot_key, slot_block, next_copy, registered, key_of, keys, blocks, new):
    """Mutates. Registers `blocks[j]` under `keys[j]` in order, skipping a block registered already (its
    content never changes while held); a key held already gets the block as its last copy. Sets `new[j]`
    for the blocks registered now; returns how many keys the table gained."""
    gained = 0
    for j in range(keys.shape[0]):
        block, key = blocks[j], keys[j]
        if registered[block]:
            new[j] = False
            continue
        new[j] = True
        registered[block] = True
        key_of[block] = key
        next_copy[block] = EMPTY
        i = probe(slot_key, slot_block, key)
        if slot_block[i] == EMPTY:
            slot_key[i] = key
            slot_block[i] = block
            gained += 1
            continue
        last = slot_block[i]
        while next_copy[last] != EMPTY:
            last = next_copy[last]
        next_copy[last] = block
    return gained


@njit(cache=True)
def remove(slot_key, slot_block, next_copy, registered, key_of, blocks):
    """Mutates. Unregisters each of `blocks` (registered, distinct); a key whose last copy goes leaves the
    table. Returns how many keys the table lost."""
    mask = slot_key.shape[0] - 1
    lost = 0
    for j in range(blocks.shape[0]):
        block = blocks[j]
        registered[block] = False
        i = find(slot_key, slot_block, key_of[block])
        if i < 0:
            raise KeyError("key table: a registered block's key is not in the table")
        head = slot_block[i]
        if head != block:  # a later copy: unlink it from the copies after the head
            before = head
            while next_copy[before] != block:
                before = next_copy[before]
                if before == EMPTY:
                    raise KeyError("key table: a registered block is not among its key's copies")
            next_copy[before] = next_copy[block]
            continue
        if next_copy[block] != EMPTY:  # the next copy becomes the earliest
            slot_block[i] = next_copy[block]
            continue
        lost += 1
        # backward shift: move up each following entry whose home slot is not in (i, k]
        k = i
        while True:
            k = (k + 1) & mask
            if slot_block[k] == EMPTY:
                break
            start = home(slot_key[k], mask)
            if (i < k and i < start <= k) or (i > k and (start > i or start <= k)):
                continue
            slot_key[i] = slot_key[k]
            slot_block[i] = slot_block[k]
            i = k
        slot_block[i] = EMPTY
    return lost


@njit(cache=True)
def rehash(slot_key, slot_block, new_key, new_block):
    """Mutates `new_key`, `new_block` (an empty, larger table): every entry of the old table, moved."""
    for s in range(slot_key.shape[0]):
        if slot_block[s] == EMPTY:
            continue
        i = probe(new_key, new_block, slot_key[s])  # keys are distinct: the probe stops at an empty slot
        new_key[i] = slot_key[s]
        new_block[i] = slot_block[s]


@njit(cache=True)
def entries(slot_key, slot_block, next_copy, out_keys, out_blocks):
    """Writes every (key, block) the table holds, copies after their head, into the outputs (sized for
    every registered block); returns how many. For the integrity check."""
    n = 0
    for s in range(slot_key.shape[0]):
        block = slot_block[s]
        while block != EMPTY and n < out_keys.shape[0]:
            out_keys[n] = slot_key[s]
            out_blocks[n] = block
            n += 1
            block = next_copy[block]
    return n


@njit(cache=True)
def unreachable(slot_key, slot_block):
    """Pure. The first held slot that a probe for its own key does not reach, or -1. For the integrity check."""
    for s in range(slot_key.shape[0]):
        if slot_block[s] != EMPTY and find(slot_key, slot_block, slot_key[s]) != s:
            return s
    return -1
