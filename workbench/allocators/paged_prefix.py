"""`paged-prefix`: `paged` plus automatic prefix caching of full blocks (vLLM's APC, DESIGN §4).

A full prompt block is registered under its chain key (`prefix_hash`). A later prompt whose leading
blocks have registered keys reuses those blocks (refcount++), so only the rest is computed. A hit
never covers the whole prompt: at least the last prompt token is recomputed, so the engine has a
token to produce logits from (vLLM's rule; a fully cached prompt recomputes its last block).

Only prompt blocks are registered: the strategy sees token ids at admission (`SeqSpec.token_ids`),
not the tokens a sequence generates, so blocks filled during decode stay unregistered (a recomputed
sequence re-admitted with prompt + generated registers those too).

When a registered block's refcount drops to 0 it becomes *cached*: evictable, reusable by a hit.
Cached blocks form an LRU queue (least recently used first). A freed request's blocks join it tail
first, so its last block is evicted before its earlier ones (vLLM's order: a suffix is less likely
to be shared than a prefix). New blocks come from never-cached free blocks first; a cached block
is evicted (its key unregistered) only when none is left.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from workbench.allocators.base import SeqSpec
from workbench.allocators.paged import PagedStrategy
from workbench.allocators.prefix_hash import block_keys


class PagedPrefixStrategy(PagedStrategy):
    name = "paged-prefix"

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self._block_of_key: dict[int, int] = {}
        self._key_of_block: dict[int, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached blocks, least recently used first

    def _lookup(self, spec: SeqSpec) -> tuple[np.ndarray, np.ndarray]:
        keys = block_keys(spec.token_ids, self.block_size)
        max_hit = (spec.num_tokens - 1) // self.block_size  # leave the last prompt token to compute
        index = self._block_of_key
        hits = []
        for key in keys[:max_hit].tolist():
            if key not in index:
                break
            hits.append(index[key])
        return np.array(hits, dtype=np.int32), keys

    def _on_admitted(self, spec: SeqSpec, keys: np.ndarray, blocks: np.ndarray, num_hit: int) -> None:
        index = self._block_of_key
        for key, block in zip(keys[num_hit:].tolist(), blocks[num_hit:keys.shape[0]].tolist(), strict=True):
            if key not in index:  # a recomputed copy of a cached block stays unregistered
                index[key] = block
                self._key_of_block[block] = key
        self.prefix_query_tokens += spec.num_tokens
        self.prefix_hit_tokens += num_hit * self.block_size

    def _claim(self, hits: np.ndarray) -> None:
        for block in hits.tolist():
            self._lru.pop(block, None)

    def _num_cached_blocks(self) -> int:
        return len(self._lru)

    def cached_block_ids(self) -> np.ndarray:
        return np.fromiter(self._lru, dtype=np.int32, count=len(self._lru))

    def registered_block_ids(self) -> np.ndarray:
        return np.fromiter(self._key_of_block, dtype=np.int32, count=len(self._key_of_block))

    def _take(self, k: int) -> np.ndarray:
        from_free = min(k, self._free.size)
        taken = self._free.pop(from_free)
        if from_free == k:
            return taken
        if k - from_free > len(self._lru):
            raise RuntimeError(f"out of blocks: need {k}, {self.num_allocatable_blocks()} allocatable")
        evicted = np.empty(k - from_free, dtype=np.int32)
        for i in range(evicted.shape[0]):
            block, _ = self._lru.popitem(last=False)
            del self._block_of_key[self._key_of_block.pop(block)]
            evicted[i] = block
        return np.concatenate([taken, evicted])

    def _release(self, blocks: np.ndarray) -> None:
        registered = np.fromiter((b in self._key_of_block for b in blocks.tolist()), dtype=bool,
                                 count=blocks.shape[0])
        for block in blocks[registered][::-1].tolist():  # tail first: evicted before the head
            self._lru[block] = None
        self._free.push(blocks[~registered])

    def check_cache_index(self) -> None:
        for key, block in self._block_of_key.items():
            if self._key_of_block.get(block) != key:
                raise AssertionError(f"hash index: key {key:#x} -> block {block}, which is not registered under it")
        if len(self._key_of_block) != len(self._block_of_key):
            raise AssertionError("hash index: a block is registered under two keys")
        free = set(self._free.ids().tolist())
        for block in self._key_of_block:
            if block in free:
                raise AssertionError(f"hash index: registered block {block} is on the free stack")
        for block in self._lru:
            if block not in self._key_of_block or self._refcount[block] != 0:
                raise AssertionError(f"cached block {block} is unregistered or still held")
