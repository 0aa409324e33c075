"""A flat hash index: chain key -> blocks, the prefix index of `paged-prefix` (vLLM v1's APC).

Every registered block sits in one dict under its chain key (the key names its whole prefix, so no
tree is needed to match a prompt: look up its keys in order until one misses). Parent keys are not
needed and are ignored. Evictable blocks are ordered by an `EvictionPolicy` (LRU by default).

Like vLLM v1's block pool (`BlockHashToBlockMap`), the index does not de-duplicate: a block filled
with content already registered (a fully cached prompt recomputing its last block, or a prompt that
missed on an evicted head and recomputed blocks still cached further on) is registered under the
same key beside the earlier one, so block tables stay append-only and each copy is cached and
evicted on its own. A lookup returns the earliest registered block still present; evicting a block
removes only that block, so the key survives while another copy does.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.prefix.eviction import EvictionPolicy, LRUPolicy


class HashPrefixIndex:
    def __init__(self, policy: EvictionPolicy | None = None) -> None:
        # key -> block, or a list of blocks in registration order when the key has copies
        # (a bare int for the common single block keeps the per-key cost at one dict slot)
        self._blocks_of_key: dict[int, int | list[int]] = {}
        self._registered = np.zeros(0, dtype=bool)  # [num_blocks] registered under some key
        self._key_of = np.zeros(0, dtype=np.uint64)  # [num_blocks] a registered block's key
        self._policy = LRUPolicy() if policy is None else policy
        self._depth_of_block: dict[int, int] | None = {} if self._policy.wants_depth else None

    def lookup(self, keys: np.ndarray, max_blocks: int) -> np.ndarray:
        index = self._blocks_of_key
        hits = []
        for key in keys[:max_blocks].tolist():
            blocks = index.get(key)
            if blocks is None:
                break
            hits.append(blocks if type(blocks) is int else blocks[0])  # the earliest copy, as vLLM
        return np.array(hits, dtype=np.int32)

    def tree_path(self, keys: np.ndarray, max_blocks: int) -> tuple[tuple[int, int], ...]:
        return ()  # a flat table: no nodes

    def block_of(self, key: int) -> int:
        """Pure. The earliest block registered under `key`, or -1: one key alone, for a sliding-window
        group's search from the right (docs/hybrid.md)."""
        blocks = self._blocks_of_key.get(key)
        return -1 if blocks is None else (blocks if type(blocks) is int else blocks[0])

    def insert(self, parent_keys: np.ndarray, keys: np.ndarray, blocks: np.ndarray,
               parent_blocks: np.ndarray) -> None:
        # a chain key names its whole prefix already: parent keys serve only a depth-ordered policy
        del parent_blocks
        index = self._blocks_of_key
        self._fit(int(blocks.max()) + 1 if blocks.shape[0] else 0)
        key_list, block_list = keys.tolist(), blocks.tolist()
        if self._depth_of_block is None and not self._registered[blocks].any() and \
                index.keys().isdisjoint(key_list) and len(set(key_list)) == len(key_list) and \
                len(set(block_list)) == len(block_list):
            # all new, nothing repeated: what the loop below does, at once
            self._registered[blocks] = True
            self._key_of[blocks] = keys
            index.update(zip(key_list, block_list, strict=True))
            return
        for parent, key, block in zip(parent_keys.tolist(), key_list, block_list, strict=True):
            if self._registered[block]:
                continue  # already registered (its content never changes while held)
            self._registered[block] = True
            self._key_of[block] = key
            if self._depth_of_block is not None:
                self._set_depth(parent, block)
            held = index.get(key)
            if held is None:
                index[key] = block
            elif type(held) is int:
                index[key] = [held, block]
            else:
                held.append(block)

    def _set_depth(self, parent: int, block: int) -> None:
        above = self._blocks_of_key.get(parent)  # registered whenever the parent is (see insert's callers)
        depth = 0 if above is None else self._depth_of_block[above if type(above) is int else above[0]] + 1
        self._depth_of_block[block] = depth
        self._policy.set_depth(block, depth)

    def claim(self, blocks: np.ndarray) -> None:
        policy = self._policy
        for block in blocks.tolist():
            policy.remove(block)
            policy.touch(block)  # a hit is a use (LFU counts it)

    def release(self, blocks: np.ndarray) -> np.ndarray:
        self._fit(int(blocks.max()) + 1 if blocks.shape[0] else 0)
        registered = self._registered[blocks]
        self._policy.add_many(blocks[registered][::-1].tolist())  # tail first: evicted before the head
        return blocks[~registered]

    def evict(self, k: int) -> np.ndarray:
        return self.evict_keyed(k)[0]

    def evict_keyed(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        if k > len(self._policy):
            raise RuntimeError(f"cannot evict {k} blocks: {len(self._policy)} evictable")
        victims = self._policy.pop_victims(k)
        evicted = np.array(victims, dtype=np.int32)
        self._registered[evicted] = False
        keys = self._key_of[evicted].tolist()
        if self._depth_of_block is not None:
            for block in victims:
                del self._depth_of_block[block]
        index = self._blocks_of_key
        for block, key in zip(victims, keys, strict=True):
            held = index[key]
            if type(held) is int:
                del index[key]
                continue
            held.remove(block)
            if len(held) == 1:
                index[key] = held[0]
        return evicted, np.array(keys, dtype=np.uint64)

    def _fit(self, num_blocks: int) -> None:
        """Mutates. Room for block ids below `num_blocks` in the per-block arrays (grown by doubling)."""
        size = self._registered.shape[0]
        if num_blocks > size:
            grow = max(num_blocks, 2 * size) - size
            self._registered = np.concatenate([self._registered, np.zeros(grow, dtype=bool)])
            self._key_of = np.concatenate([self._key_of, np.zeros(grow, dtype=np.uint64)])

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
        listed = 0
        for key, held in self._blocks_of_key.items():
            blocks = [held] if type(held) is int else held
            if len(blocks) < 1 or (type(held) is list and len(held) < 2):
                raise AssertionError(f"hash index: key {key:#x} holds a list of {len(blocks)} blocks")
            for block in blocks:
                if not self._registered[block] or int(self._key_of[block]) != key:
                    raise AssertionError(f"hash index: key {key:#x} -> block {block}, which is not registered "
                                         "under it")
            listed += len(blocks)
        registered = self.registered_block_ids()
        if listed != registered.shape[0]:
            raise AssertionError("hash index: a block is registered under two keys")
        if np.intersect1d(registered, free_block_ids).shape[0]:
            raise AssertionError("hash index: a registered block is on the free stack")
        evictable = self._policy.ids()
        if np.unique(evictable).shape[0] != evictable.shape[0]:
            raise AssertionError("hash index: a block is evictable twice")
        for block in evictable.tolist():
            if not self._registered[block] or refcount[block] != 0:
                raise AssertionError(f"cached block {block} is unregistered or still held")
