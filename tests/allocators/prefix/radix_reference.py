"""The radix index block by block: one tree node per block, the reference the compressed index
(`prefix.radix_index`) must match in every hit, victim and evictable order.

SGLang's `RadixCache` at `page_size` = block size: a node is a block, named by its chain key, linked under
its parent key's block. Semantics (as `prefix.radix_index` states them):
- `insert` registers only new prefixes, and only under the registered block its sequence really holds.
- Lock: a block is *locked* while a sequence holds it or any block below it (`held`, and
  `_locked_children`: how many children are locked).
- Evictable = registered and unlocked; the policy sees evictable *leaves* only. Evicting a leaf may make
  its parent an evictable leaf, which re-enters the policy with its recorded statistics (`restore`).
"""

from __future__ import annotations

import copy

import numpy as np

from workbench.allocators.prefix.eviction import EvictionPolicy, LRUPolicy

_ROOT = -1  # the parent block of a prompt's first block


class ReferenceRadixIndex:
    def __init__(self, policy: EvictionPolicy | None = None) -> None:
        self._block_of_key: dict[int, int] = {}
        self._key_of_block: dict[int, int] = {}
        self._parent: dict[int, int] = {}  # registered block -> its parent block (_ROOT: none)
        self._children: dict[int, int] = {}  # registered block -> number of registered children
        self._locked_children: dict[int, int] = {}  # registered block -> number of locked children
        self._held: set[int] = set()  # registered blocks a sequence holds (refcount > 0)
        self._depth: dict[int, int] = {}  # registered block -> depth (0: a prompt's first block)
        self._evictable: set[int] = set()  # registered and unlocked (the policy holds its leaves)
        self._policy = LRUPolicy() if policy is None else policy
        self._wants_depth = self._policy.wants_depth

    def _locked(self, block: int) -> bool:
        return block in self._held or self._locked_children[block] > 0

    def lookup(self, keys: np.ndarray, max_blocks: int) -> np.ndarray:
        index = self._block_of_key
        hits = []
        for key in keys[:max_blocks].tolist():
            block = index.get(key)
            if block is None:
                break
            hits.append(block)
        return np.array(hits, dtype=np.int32)

    def insert(self, parent_keys: np.ndarray, keys: np.ndarray, blocks: np.ndarray,
               parent_blocks: np.ndarray) -> None:
        index, key_of_block, depth_of = self._block_of_key, self._key_of_block, self._depth
        for parent_key, key, block, before in zip(parent_keys.tolist(), keys.tolist(), blocks.tolist(),
                                                  parent_blocks.tolist(), strict=True):
            if key in index or block in key_of_block:
                continue  # cached already: this block is a copy and stays unregistered
            parent = _ROOT if parent_key == 0 else index.get(parent_key)
            if parent != before:
                # no path from the root reaches this block: its parent prefix was evicted, or the
                # sequence holds an unregistered copy of it (the node is another block)
                continue
            index[key] = block
            key_of_block[block] = key
            self._parent[block] = parent
            self._children[block] = 0
            self._locked_children[block] = 0
            self._held.add(block)  # an inserted block is held by the sequence that filled it
            depth = 0 if parent == _ROOT else depth_of[parent] + 1
            depth_of[block] = depth
            if self._wants_depth:
                self._policy.set_depth(block, depth)
            if parent != _ROOT:
                # the parent is the block before in the inserting sequence, so it is held: locked
                # already, and no leaf of the policy
                self._children[parent] += 1
                self._locked_children[parent] += 1

    def claim(self, blocks: np.ndarray) -> None:
        for block in blocks.tolist():  # a path from the root, head first
            self._policy.touch(block)  # a hit is a use (SGLang updates last_access_time on match)
            if block in self._evictable:
                self._evictable.remove(block)
                self._policy.remove(block)
                self._held.add(block)
                self._lock_ancestors(block)
            else:
                self._held.add(block)

    def release(self, blocks: np.ndarray) -> np.ndarray:
        registered = np.fromiter((b in self._key_of_block for b in blocks.tolist()), dtype=bool,
                                 count=blocks.shape[0])
        mine = blocks[registered].tolist()
        self._held.difference_update(mine)
        for block in reversed(mine):  # tail first: the deepest node unlocks first, then its ancestors
            if block not in self._evictable and not self._locked(block):
                self._unlock(block)
        return blocks[~registered]

    def _lock_ancestors(self, block: int) -> None:
        """`block` just became locked: its ancestors count one more locked child, up to the first
        one that was locked already."""
        parent = self._parent[block]
        while parent != _ROOT:
            was_locked = self._locked(parent)
            self._locked_children[parent] += 1
            if was_locked:
                return
            self._evictable.remove(parent)
            self._policy.remove(parent)
            parent = self._parent[parent]

    def _unlock(self, block: int) -> None:
        """`block` just became unlocked: it is evictable (a leaf enters the policy, an inner node's use
        is recorded for when it becomes one); its parent may unlock in turn."""
        policy, parent_of, locked_children, held = self._policy, self._parent, self._locked_children, self._held
        while True:
            self._evictable.add(block)
            if self._children[block] == 0:
                policy.add(block)
            else:
                policy.touch(block)
            parent = parent_of[block]
            if parent == _ROOT:
                return
            locked_children[parent] -= 1
            if parent in held or locked_children[parent] > 0:
                return
            block = parent

    def evict(self, k: int) -> np.ndarray:
        return self.evict_keyed(k)[0]

    def evict_keyed(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        if k > len(self._evictable):
            raise RuntimeError(f"cannot evict {k} blocks: {len(self._evictable)} evictable")
        evicted = np.empty(k, dtype=np.int32)
        keys = np.empty(k, dtype=np.uint64)
        for i in range(k):
            block = self._policy.pop_victim()  # an evictable leaf
            keys[i] = self._key_of_block[block]
            self._unregister(block)
            evicted[i] = block
        return evicted, keys

    def _unregister(self, block: int) -> None:
        del self._block_of_key[self._key_of_block.pop(block)]
        self._evictable.remove(block)
        parent = self._parent.pop(block)
        del self._children[block], self._locked_children[block], self._depth[block]
        if parent != _ROOT:
            self._children[parent] -= 1
            if self._children[parent] == 0 and parent in self._evictable:
                self._policy.restore(parent)  # a leaf now, ordered by its recorded statistics

    def num_evictable(self) -> int:
        return len(self._evictable)

    def evictable_block_ids(self) -> np.ndarray:
        """The evictable blocks in the order repeated `evict(1)` would take them (simulated on
        copies: O(n log n), for checks and tests). Pure."""
        trial = copy.deepcopy(self)
        return trial.evict(len(self._evictable))

    def evictable_block_set(self) -> np.ndarray:
        return np.fromiter(self._evictable, dtype=np.int32, count=len(self._evictable))

    def registered_block_ids(self) -> np.ndarray:
        return np.fromiter(self._key_of_block, dtype=np.int32, count=len(self._key_of_block))

    def check_integrity(self, refcount: np.ndarray, free_block_ids: np.ndarray) -> None:
        for key, block in self._block_of_key.items():
            if self._key_of_block.get(block) != key:
                raise AssertionError(f"radix index: key {key:#x} -> block {block}, not registered under it")
        if len(self._key_of_block) != len(self._block_of_key):
            raise AssertionError("radix index: a block is registered under two keys")
        free = set(free_block_ids.tolist())
        children = dict.fromkeys(self._key_of_block, 0)
        locked_children = dict.fromkeys(self._key_of_block, 0)
        for block in self._key_of_block:
            if block in free:
                raise AssertionError(f"radix index: registered block {block} is on the free stack")
            if (block in self._held) != bool(refcount[block] > 0):
                raise AssertionError(f"radix index: block {block} held={block in self._held}, refcount "
                                     f"{refcount[block]}")
            parent = self._parent[block]
            if parent != _ROOT:
                if parent not in self._key_of_block:
                    raise AssertionError(f"radix index: block {block}'s parent {parent} is not registered")
                if self._depth[block] != self._depth[parent] + 1:
                    raise AssertionError(f"radix index: block {block}'s depth is not its parent's + 1")
                children[parent] += 1
        for block in sorted(self._key_of_block, key=self._depth.__getitem__, reverse=True):
            locked = block in self._held or locked_children[block] > 0
            if locked and self._parent[block] != _ROOT:
                locked_children[self._parent[block]] += 1
            if locked == (block in self._evictable):
                raise AssertionError(f"radix index: block {block} locked={locked} but evictable="
                                     f"{block in self._evictable}")
        if children != self._children or locked_children != self._locked_children:
            raise AssertionError("radix index: child or lock counts disagree with the tree")
        leaves = {b for b in self._evictable if children[b] == 0}
        in_policy = set(self._policy.ids().tolist())
        if in_policy != leaves:
            raise AssertionError(f"radix index: the policy holds {sorted(in_policy)}, the evictable leaves are "
                                 f"{sorted(leaves)}")
