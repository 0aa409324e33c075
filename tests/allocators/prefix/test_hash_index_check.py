"""The hash index's integrity check (`hash_index_check`) catches each corruption of its arrays and says which
invariant broke, as `check_integrity` of the paged pool does for the tables."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.allocators.prefix.hash_index import HashPrefixIndex
from workbench.allocators.prefix.key_table import EMPTY

KEYS = np.array([11, 22, 33, 44], dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # mixed, as chain keys are


def _healthy():
    """Blocks 0-3 registered as a chain, block 4 a second copy of block 0's key; 2 and 3 released (evictable);
    the pool's free stack holds 5-7. Returns (index, refcount, free ids)."""
    index = HashPrefixIndex()
    index.insert(np.zeros(4, dtype=np.uint64), KEYS, np.arange(4, dtype=np.int32), np.arange(-1, 3, dtype=np.int32))
    index.insert(np.zeros(1, dtype=np.uint64), KEYS[:1], np.array([4], dtype=np.int32), np.array([-1], np.int32))
    refcount = np.array([1, 1, 0, 0, 1, 0, 0, 0], dtype=np.int32)
    index.release(np.array([3, 2], dtype=np.int32))
    index.check_integrity(refcount, np.array([5, 6, 7], dtype=np.int32))
    return index, refcount, np.array([5, 6, 7], dtype=np.int32)


def _slot_of(index, key):
    return int(np.flatnonzero((index._slot_block != EMPTY) & (index._slot_key == key))[0])


def _unreachable(index):
    """Move key 1's slot one past an empty slot: a probe from its home stops before it."""
    s = _slot_of(index, KEYS[1])
    far = (s + 2) % index._slot_key.shape[0]
    assert index._slot_block[(s + 1) % index._slot_key.shape[0]] == EMPTY and index._slot_block[far] == EMPTY
    index._slot_key[far], index._slot_block[far] = index._slot_key[s], index._slot_block[s]
    index._slot_block[s] = EMPTY


def _key_in_two_slots(index, block_key_too: bool):
    """Key 3's slot takes key 2: with block 3 keyed 2 as well, every block is listed under its own key once
    and only the slots repeat a key; without, block 2 is listed twice (key 2's slot and this one)."""
    s = _slot_of(index, KEYS[3])
    index._slot_key[s] = KEYS[2]
    if block_key_too:
        index._key_of[3] = KEYS[2]
    else:
        index._slot_block[s] = 2


CORRUPTIONS = {
    "the table lists 5 blocks, 4 are registered": lambda i, r, f: i._registered.__setitem__(1, False),
    "which is not registered under it": lambda i, r, f: i._key_of.__setitem__(2, i._key_of[2] + np.uint64(1)),
    "a block is listed twice": lambda i, r, f: _key_in_two_slots(i, block_key_too=False),
    "4 slots held, 5 keys counted": lambda i, r, f: setattr(i, "_num_keys", 5),
    "4 slots held, 4 keys counted": lambda i, r, f: _key_in_two_slots(i, block_key_too=True),
    "is not reached by a probe": lambda i, r, f: _unreachable(i),
    "a registered block is on the free stack": lambda i, r, f: f.__setitem__(0, 1),
    # the LRU list refuses a block twice itself: its listing is replaced
    "a block is evictable twice": lambda i, r, f: setattr(i._policy, "ids", lambda: np.array([2, 3, 2], np.int32)),
    "a cached block is unregistered or still held": lambda i, r, f: r.__setitem__(3, 1),
}


@pytest.mark.parametrize("what", CORRUPTIONS)
def test_check_integrity_names_each_broken_invariant(what):
    index, refcount, free_ids = _healthy()
    CORRUPTIONS[what](index, refcount, free_ids)
    with pytest.raises(AssertionError, match=what):
        index.check_integrity(refcount, free_ids)
