"""The hash index's compiled key table against a dict of lists, through random registrations and removals.

A 16-slot table with keys whose low bits crowd the last slots makes the probes wrap around the end and
the backward shift of a deletion move entries across it: the cases a large table with mixed keys meets
only rarely."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.allocators.prefix import key_table

NUM_BLOCKS = 12  # at most 8 keys ever held: the 16-slot table stays half full


def keys_held(slot_key, slot_block, next_copy):
    """The table as {key: [blocks in registration order]}, read through `entries`."""
    keys = np.empty(NUM_BLOCKS + 1, dtype=np.uint64)
    blocks = np.empty(NUM_BLOCKS + 1, dtype=np.int32)
    n = key_table.entries(slot_key, slot_block, next_copy, keys, blocks)
    held: dict[int, list[int]] = {}
    for key, block in zip(keys[:n].tolist(), blocks[:n].tolist(), strict=True):
        held.setdefault(key, []).append(block)
    return held


@pytest.mark.parametrize("seed", range(12))
def test_the_table_answers_as_a_dict_of_lists(seed):
    rng = np.random.default_rng(seed)
    slot_key, slot_block = key_table.empty_slots(16)
    next_copy = np.full(NUM_BLOCKS, key_table.EMPTY, dtype=np.int32)
    registered = np.zeros(NUM_BLOCKS, dtype=bool)
    key_of = np.zeros(NUM_BLOCKS, dtype=np.uint64)
    # 8 keys: home slots 13, 14, 15, 0 (two keys each) once masked to 16 slots
    pool = [np.uint64((home % 16) + 16 * (1 + i)) for i, home in enumerate([13, 13, 14, 14, 15, 15, 16, 16])]
    ref: dict[int, list[int]] = {}
    for _ in range(300):
        free = np.flatnonzero(~registered)
        if free.shape[0] and (rng.random() < 0.55 or not registered.any()):
            blocks = rng.choice(free, size=min(int(rng.integers(1, 4)), free.shape[0]), replace=False).astype(np.int32)
            keys = np.array([pool[i] for i in rng.integers(0, len(pool), blocks.shape[0])], dtype=np.uint64)
            new = np.empty(blocks.shape[0], dtype=bool)
            gained = key_table.insert(slot_key, slot_block, next_copy, registered, key_of, keys, blocks, new)
            assert new.all() and gained == len(set(keys.tolist()) - set(ref))
            for key, block in zip(keys.tolist(), blocks.tolist(), strict=True):
                ref.setdefault(key, []).append(block)
        else:
            held = np.flatnonzero(registered)
            blocks = rng.choice(held, size=min(int(rng.integers(1, 4)), held.shape[0]), replace=False).astype(np.int32)
            lost = key_table.remove(slot_key, slot_block, next_copy, registered, key_of, blocks)
            before = len(ref)
            for block in blocks.tolist():
                key = next(k for k, bs in ref.items() if block in bs)
                ref[key].remove(block)
                if not ref[key]:
                    del ref[key]
            assert lost == before - len(ref)
        assert keys_held(slot_key, slot_block, next_copy) == ref
        hits = np.empty(1, dtype=np.int32)
        for key in pool:  # each key is found from its home slot, the earliest copy first
            n = key_table.lookup(slot_key, slot_block, np.array([key]), 1, hits)
            assert (hits[:n].tolist() == [ref[int(key)][0]]) if int(key) in ref else n == 0
        assert sorted(np.flatnonzero(registered).tolist()) == sorted(b for bs in ref.values() for b in bs)


def test_a_lookup_stops_at_the_first_key_missing_and_at_max_blocks():
    slot_key, slot_block = key_table.empty_slots(16)
    next_copy = np.full(8, key_table.EMPTY, dtype=np.int32)
    registered, key_of = np.zeros(8, dtype=bool), np.zeros(8, dtype=np.uint64)
    keys = np.array([5, 21, 37], dtype=np.uint64)  # one home slot: probes of 2 and 3 steps
    key_table.insert(slot_key, slot_block, next_copy, registered, key_of, keys, np.array([3, 1, 2], np.int32),
                     np.empty(3, dtype=bool))
    out = np.empty(4, dtype=np.int32)
    assert key_table.lookup(slot_key, slot_block, np.array([5, 21, 37, 53], dtype=np.uint64), 4, out) == 3
    assert out[:3].tolist() == [3, 1, 2]
    assert key_table.lookup(slot_key, slot_block, np.array([5, 99, 37], dtype=np.uint64), 3, out) == 1
    assert key_table.lookup(slot_key, slot_block, keys, 2, out) == 2


def test_growing_the_table_keeps_every_entry():
    slot_key, slot_block = key_table.empty_slots(16)
    next_copy = np.full(8, key_table.EMPTY, dtype=np.int32)
    registered, key_of = np.zeros(8, dtype=bool), np.zeros(8, dtype=np.uint64)
    keys = np.array([15, 31, 47, 2, 31], dtype=np.uint64)
    key_table.insert(slot_key, slot_block, next_copy, registered, key_of, keys, np.arange(5, dtype=np.int32),
                     np.empty(5, dtype=bool))
    before = keys_held(slot_key, slot_block, next_copy)
    new_key, new_block = key_table.empty_slots(64)
    key_table.rehash(slot_key, slot_block, new_key, new_block)
    assert keys_held(new_key, new_block, next_copy) == before == {15: [0], 31: [1, 4], 47: [2], 2: [3]}
