"""A flat hash index: chain key -> blocks, the prefix index of `paged-prefix` (vLLM v1's APC).

Every registered block sits in one table under its chain key (the key names its whole prefix, so no
tree is needed to match a prompt: look up its keys in order until one misses). Parent keys are not
needed and are ignored. Evictable blocks are ordered by an `EvictionPolicy` (LRU by default). The table
and the per-block state are arrays, walked by compiled loops (`key_table`): a step's registrations,
evictions and releases are one call each, whatever their number of blocks.

Like vLLM v1's block pool (`BlockHashToBlockMap`), the index does not de-duplicate: a block filled
with content already registered (a fully cached prompt recomputing its last block, or a prompt that
missed on an evicted head and recomputed blocks still cached further on) is registered under the
same key beside the earlier one, so block tables stay append-only and each copy is cached and
evicted on its own. A lookup returns the earliest registered block still present; evicting a block
removes only that block, so the key survives while another copy does.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.id_bound import id_bound
from workbench.allocators.prefix import hash_index_check as C
from workbench.allocators.prefix import key_table
from workbench.allocators.prefix.eviction import EvictionPolicy, LRUPolicy

MIN_SLOTS = 1024  # the table's slots at first; it doubles to stay at most half full


class HashPrefixIndex:
    def __init__(self, policy: EvictionPolicy | None = None) -> None:
        # chain key -> its earliest registered block (later copies follow `_next_copy`)
        self._slot_key, self._slot_block = key_table.empty_slots(MIN_SLOTS)
        self._num_keys = 0
        self._registered = np.zeros(0, dtype=bool)  # [num_blocks] registered under some key
        self._key_of = np.zeros(0, dtype=np.uint64)  # [num_blocks] a registered block's key
        self._next_copy = np.zeros(0, dtype=np.int32)  # [num_blocks] the next block under the same key, -1: none
        self._policy = LRUPolicy() if policy is None else policy
        self._depth_of_block: dict[int, int] | None = {} if self._policy.wants_depth else None

    def lookup(self, keys: np.ndarray, max_blocks: int) -> np.ndarray:
        hits = np.empty(min(max_blocks, keys.shape[0]), dtype=np.int32)
        # the earliest copies, as vLLM; uint64 keys (compared with another integer type, Numba would go through floats)
        n = key_table.lookup(self._slot_key, self._slot_block, keys.astype(np.uint64, copy=False), max_blocks, hits)
        return hits[:n]

    def tree_path(self, keys: np.ndarray, max_blocks: int) -> tuple[tuple[int, int], ...]:
        return ()  # a flat table: no nodes

    def block_of(self, key: int) -> int:
        """Pure. The earliest block registered under `key`, or -1: one key alone, for a sliding-window
        group's search from the right (docs/hybrid.md)."""
        slot = key_table.find(self._slot_key, self._slot_block, np.uint64(key))
        return -1 if slot < 0 else int(self._slot_block[slot])

    def insert(self, parent_keys: np.ndarray, keys: np.ndarray, blocks: np.ndarray,
               parent_blocks: np.ndarray) -> None:
        # a chain key names its whole prefix already: parent keys serve only a depth-ordered policy
        del parent_blocks
        if not keys.shape[0]:
            return
        self._fit(id_bound(blocks))
        if 2 * (self._num_keys + keys.shape[0]) > self._slot_key.shape[0]:
            self._grow_table(self._num_keys + keys.shape[0])
        keys, blocks = keys.astype(np.uint64, copy=False), blocks.astype(np.int32, copy=False)
        new = np.empty(keys.shape[0], dtype=bool)
        if self._depth_of_block is None:
            self._num_keys += key_table.insert(self._slot_key, self._slot_block, self._next_copy, self._registered,
                                               self._key_of, keys, blocks, new)
            return
        for j, (parent, block) in enumerate(zip(parent_keys.tolist(), blocks.tolist(), strict=True)):
            if self._registered[block]:
                continue
            self._set_depth(parent, block)  # one at a time: its parent's block as registered before it
            self._num_keys += key_table.insert(self._slot_key, self._slot_block, self._next_copy, self._registered,
                                               self._key_of, keys[j:j + 1], blocks[j:j + 1], new[j:j + 1])

    def _set_depth(self, parent: int, block: int) -> None:
        above = self.block_of(parent)  # registered whenever the parent is (see insert's callers)
        depth = 0 if above < 0 else self._depth_of_block[above] + 1
        self._depth_of_block[block] = depth
        self._policy.set_depth(block, depth)

    def claim(self, blocks: np.ndarray) -> None:
        self._policy.claim_many(blocks)  # a hit is a use (LFU counts it)

    def release(self, blocks: np.ndarray) -> np.ndarray:
        self._fit(id_bound(blocks))
        registered = self._registered[blocks]
        self._policy.add_many(blocks[registered][::-1])  # tail first: evicted before the head
        return blocks[~registered]

    def evict(self, k: int) -> np.ndarray:
        return self.evict_keyed(k)[0]

    def evict_keyed(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        if k > len(self._policy):
            raise RuntimeError(f"cannot evict {k} blocks: {len(self._policy)} evictable")
        evicted = np.asarray(self._policy.pop_victims(k), dtype=np.int32)
        keys = self._key_of[evicted]
        if self._depth_of_block is not None:
            for block in evicted.tolist():
                del self._depth_of_block[block]
        self._num_keys -= key_table.remove(self._slot_key, self._slot_block, self._next_copy, self._registered,
                                           self._key_of, evicted)
        return evicted, keys

    def one_call_view(self, num_blocks: int, more_keys: int):
        """For `prefix.decode_append` and `prefix.take_release`: (slot keys, slot blocks, next copies, registered,
        key of each block, the LRU order's arrays), with the per-block arrays, the LRU order's too, covering block
        ids below `num_blocks`; None when the table would have to grow to take `more_keys` keys (`insert` grows it
        then, at the same moment as ever) or the eviction order is not LRU's."""
        if type(self._policy) is not LRUPolicy or 2 * (self._num_keys + more_keys) > self._slot_key.shape[0]:
            return None
        self._fit(num_blocks)
        self._policy.fit(num_blocks)
        return (self._slot_key, self._slot_block, self._next_copy, self._registered, self._key_of,
                self._policy.compiled_view())

    def keys_changed(self, delta: int) -> None:
        """Mutates. A compiled caller (`prefix.decode_append`) added `delta` keys to the table, net."""
        self._num_keys += delta

    def _fit(self, num_blocks: int) -> None:
        """Mutates. Room for block ids below `num_blocks` in the per-block arrays (grown by doubling)."""
        size = self._registered.shape[0]
        if num_blocks > size:
            grow = max(num_blocks, 2 * size) - size
            self._registered = np.concatenate([self._registered, np.zeros(grow, dtype=bool)])
            self._key_of = np.concatenate([self._key_of, np.zeros(grow, dtype=np.uint64)])
            self._next_copy = np.concatenate([self._next_copy, np.full(grow, key_table.EMPTY, dtype=np.int32)])

    def _grow_table(self, num_keys: int) -> None:
        """Mutates. A table of at least twice `num_keys` slots, holding every entry of the old one."""
        num_slots = self._slot_key.shape[0]
        while num_slots < 2 * num_keys:
            num_slots *= 2
        slot_key, slot_block = key_table.empty_slots(num_slots)
        key_table.rehash(self._slot_key, self._slot_block, slot_key, slot_block)
        self._slot_key, self._slot_block = slot_key, slot_block

    def num_evictable(self) -> int:
        return len(self._policy)

    def evictable_block_ids(self) -> np.ndarray:
        return self._policy.ids()

    def evictable_block_set(self) -> np.ndarray:
        return self._policy.ids()

    def registered_under(self, block: int, key: int) -> bool:
        return block < self._registered.shape[0] and bool(self._registered[block]) and int(self._key_of[block]) == key

    def registered_block_ids(self) -> np.ndarray:
        return np.flatnonzero(self._registered).astype(np.int32)

    def check_integrity(self, refcount: np.ndarray, free_block_ids: np.ndarray) -> None:
        """Raise AssertionError naming the first broken invariant (`hash_index_check.check_index`)."""
        ids = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # one compiled signature
        code, a, b = C.check_index(self._slot_key, self._slot_block, self._next_copy,
                                   self._registered, self._key_of, self._num_keys, refcount, ids(free_block_ids),
                                   ids(self._policy.ids()))
        if code != C.OK:
            raise AssertionError("hash index: " + _words(code, a, b))


def _words(code: int, a: int, b: int) -> str:
    if code == C.LISTED:
        return f"the table lists {a} blocks, {b} are registered"
    if code == C.NOT_REGISTERED_UNDER:
        return f"key {a & (2 ** 64 - 1):#x} -> block {b}, which is not registered under it"
    if code == C.SLOTS_HELD:
        return f"{a} slots held, {b} keys counted"
    if code == C.UNREACHED:
        return f"key {a & (2 ** 64 - 1):#x} is not reached by a probe"
    return {C.LISTED_TWICE: "a block is listed twice", C.FREE_REGISTERED: "a registered block is on the free stack",
            C.EVICTABLE_TWICE: "a block is evictable twice",
            C.EVICTABLE_NOT_CACHED: "a cached block is unregistered or still held"}[code]
