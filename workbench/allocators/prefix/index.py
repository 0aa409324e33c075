"""The prefix index of a paged strategy: which blocks hold which prefixes, and which may be evicted.

A paged strategy with a prefix cache *holds* one `PrefixIndex` (composition, not a subclass per
cache). The strategy owns the blocks (refcounts, free stack, tables); the index owns the mapping
from prefix keys to blocks and the evictable set, ordered by its `EvictionPolicy`.

Keys: a full block is named by the key of the whole prefix ending with it (`prefix.chains`: a hash
chain over block contents, key = f(parent key, block tokens)), so equal keys mean equal prefixes.
`insert` also gets each block's parent key (0 for a first block), which is all a tree-shaped index
(a radix tree at page = block size, evicting leaves first) needs to link a block under its parent.

Block states as the index sees them: unregistered, registered and held (refcount > 0, owned by the
strategy), or registered and evictable (refcount 0, counted as cached). Only the blocks a strategy
passes in are ever registered.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class PrefixIndex(Protocol):
    def lookup(self, keys: np.ndarray, max_blocks: int) -> np.ndarray:
        """Pure. Blocks registered under the leading run of `keys` (uint64 [num_full_blocks], a
        prompt's chain keys in order), at most `max_blocks` of them, int32 [num_hit]."""
        ...

    def tree_path(self, keys: np.ndarray, max_blocks: int) -> tuple[tuple[int, int], ...]:
        """Pure. The tree nodes `lookup(keys, max_blocks)` runs through, root first, as (node id, blocks of the
        node matched); () for an index that is no tree (`Strategy.prefix_match`)."""
        ...

    def insert(self, parent_keys: np.ndarray, keys: np.ndarray, blocks: np.ndarray,
               parent_blocks: np.ndarray) -> None:
        """Mutates. Register full blocks (int32 [k]) under `keys` (uint64 [k]); `parent_keys[i]` (uint64
        [k]) is the key of the block before `blocks[i]` in its sequence (0: none) and `parent_blocks[i]`
        (int32 [k]) that block itself (-1: none; a tree links a block only under the node its sequence
        really holds, not under a copy's registered twin). A key already
        registered may get a second block holding the same content (a recomputed copy): the index
        registers it beside the first (vLLM's block pool; `lookup` returns the earliest) or leaves it
        unregistered (then `release` hands it back for the free stack)."""
        ...

    def claim(self, blocks: np.ndarray) -> None:
        """Mutates. Hit blocks (int32 [k]) are about to gain holders: those that were evictable leave
        the evictable set (others are unaffected)."""
        ...

    def release(self, blocks: np.ndarray) -> np.ndarray:
        """Mutates. Blocks whose refcount just reached 0 (int32 [k], a sequence's head first): the
        registered ones become evictable, tail first (so a request's last block goes before its
        first); returns the others, int32 in the given order, for the free stack."""
        ...

    def evict(self, k: int) -> np.ndarray:
        """Mutates. Unregister and return k evictable blocks chosen by the eviction policy, int32 [k]
        (the caller reuses them); raises RuntimeError if fewer than k are evictable."""
        ...

    def evict_keyed(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Mutates. `evict`, also returning the evicted blocks' keys, uint64 [k] (a host tier keeps
        their KV under them)."""
        ...

    def num_evictable(self) -> int:
        """Registered blocks held by no sequence (the strategy's cached blocks). Pure."""
        ...

    def evictable_block_ids(self) -> np.ndarray:
        """The evictable blocks, next victim first, int32 [num_evictable]. Pure."""
        ...

    def evictable_block_set(self) -> np.ndarray:
        """The evictable blocks in no particular order, int32 [num_evictable]: what integrity checks
        need after every operation, without the cost of working out the eviction order. Pure."""
        ...

    def registered_block_ids(self) -> np.ndarray:
        """Every registered block (held or evictable), int32 [num_registered]. Pure."""
        ...

    def registered_under(self, block: int, key: int) -> bool:
        """Whether `block` is registered under chain key `key` (a hit can reach it). Pure."""
        ...

    def check_integrity(self, refcount: np.ndarray, free_block_ids: np.ndarray) -> None:
        """Raise AssertionError if the index disagrees with the strategy's blocks: `refcount` int32
        [num_blocks] (holders per block), `free_block_ids` int32 [num_free] (the free stack). Pure."""
        ...
