"""`paged-prefix`: `paged` plus automatic prefix caching of full blocks (vLLM's APC, docs/strategies.md).

A full prompt block is registered under its chain key (`prefix_hash`). A later prompt whose leading
blocks have registered keys reuses those blocks (refcount++), so only the rest is computed. A hit
never covers the whole prompt: at least the last prompt token is recomputed, so the engine has a
token to produce logits from (vLLM's rule; a fully cached prompt recomputes its last block).

Blocks filled during decode are registered too when `append` gets the new tokens' ids: each
sequence carries the key of its last full block and the running term sum of its partial block
(`prefix_hash`), so the key of a block it fills is exactly the key a later prompt holding the same
tokens computes (a multi-turn prompt hits the previous answer). The block just filled holds exactly
that sequence's tokens: a writer into a shared block copies it first, so parallel samples and beams,
which diverge, each register their own block. A fork inherits the parent's chain. A sequence that
appends without token ids has unknown content from then on and registers nothing more.

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
from workbench.allocators.prefix_hash import CHAIN_BASE, block_keys, position_salt, tail_term_sum
from workbench.allocators.prefix_loops import append_terms


class PagedPrefixStrategy(PagedStrategy):
    name = "paged-prefix"
    wants_token_ids = True

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self._block_of_key: dict[int, int] = {}
        self._key_of_block: dict[int, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached blocks, least recently used first
        # per row of `tables.seqs`, set whenever a row gets a sequence (admit, fork)
        self._chain_key = np.zeros(0, dtype=np.uint64)  # [rows] key of the last full block (0: none)
        self._tail_sum = np.zeros(0, dtype=np.uint64)  # [rows] term sum of the partial last block's tokens
        self._known = np.zeros(0, dtype=bool)  # [rows] every token id of the sequence is known
        self._salt = position_salt(self.block_size)

    def _fit_rows(self) -> None:
        grow = self.tables.seqs.capacity_rows - self._known.shape[0]
        if grow > 0:
            self._chain_key = np.concatenate([self._chain_key, np.zeros(grow, dtype=np.uint64)])
            self._tail_sum = np.concatenate([self._tail_sum, np.zeros(grow, dtype=np.uint64)])
            self._known = np.concatenate([self._known, np.zeros(grow, dtype=bool)])

    def fork(self, parent_id: int, child_id: int):
        """Mutates. As `paged`; the child continues the parent's hash chain (same tokens)."""
        result = super().fork(parent_id, child_id)
        self._fit_rows()
        parent, child = self.tables.seqs.row(parent_id), self.tables.seqs.row(child_id)
        self._chain_key[child] = self._chain_key[parent]
        self._tail_sum[child] = self._tail_sum[parent]
        self._known[child] = self._known[parent]
        return result

    def append(self, seq_ids: list[int], token_ids: np.ndarray | None = None):
        """Mutates. As `paged`; then each sequence whose block became full with this token registers it
        under its chain key (unless the key already names another block, or its tokens are unknown)."""
        result = super().append(seq_ids)
        rows = self.tables.seqs.rows(seq_ids)
        if token_ids is None:
            self._known[rows] = False
            return result
        filled_rows = np.empty(rows.shape[0], dtype=np.int64)
        filled_keys = np.empty(rows.shape[0], dtype=np.uint64)
        num_filled = append_terms(rows, self.tables.seqs.column("length"), token_ids, self._salt, CHAIN_BASE,
                                  self._chain_key, self._tail_sum, filled_rows, filled_keys)
        if num_filled:
            known = self._known[filled_rows[:num_filled]]
            self._register(filled_keys[:num_filled][known], self.tables.last_blocks(filled_rows[:num_filled][known]))
        return result

    def _register(self, keys: np.ndarray, blocks: np.ndarray) -> None:
        """Mutates the index. A key already naming another block keeps it (the copy stays unregistered)."""
        index = self._block_of_key
        for key, block in zip(keys.tolist(), blocks.tolist(), strict=True):
            if key not in index:
                index[key] = block
                self._key_of_block[block] = key

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

    def _on_admitted(self, seq_ids: list[int], spec: SeqSpec, keys: np.ndarray, blocks: np.ndarray,
                     num_hit: int) -> None:
        self._register(keys[num_hit:], blocks[num_hit:keys.shape[0]])  # a recomputed copy stays unregistered
        self._fit_rows()
        rows = self.tables.seqs.rows(seq_ids)
        self._chain_key[rows] = keys[-1] if keys.shape[0] else 0
        self._tail_sum[rows] = tail_term_sum(spec.token_ids, self.block_size)
        self._known[rows] = True
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
