"""A hash-chain prefix cache's own arrays, lent to a compiled step loop (workbench.engine.compiled_paged).

`CompiledPool` with the index beside the pool: the key table, the per-block registration, the LRU order and
each row's chain. The loop admits, appends and frees with the functions the strategy's one-call verbs call
(`prefix.admit_one_call.place_prompt`, `prefix.decode_append.append_evicting`,
`prefix.take_release.release_to_cache`), so it runs exactly the cases those serve: the hash index under LRU,
with no tier and no recurrent state (`PrefixCacheStrategy`'s `_one_call`). After the run `finish` writes back
what only the loop counted: the keys the table holds and the strategy's prefix counters.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.paged.compiled_pool import CompiledPool


class CompiledPrefixPool(CompiledPool):
    """Mutates the strategy it views (through the loop, and in `grow_rows`, `grow_keys` and `finish`)."""

    def __init__(self, strategy) -> None:
        """`strategy`: a workbench.allocators.prefix.prefix_cache.PrefixCacheStrategy whose `_one_call` holds,
        under LRU eviction."""
        super().__init__(strategy)
        self.index = strategy.prefix
        if self.index.one_call_view(strategy.num_blocks, 0) is None:  # also fits the per-block arrays
            raise ValueError("a compiled loop runs a hash index under LRU eviction only")
        strategy._chains.fit(self.capacity_rows)

    def views(self) -> tuple:
        """(slot keys, slot blocks, next copies, registered, key of each block, the LRU order's five arrays,
        position salt, chain key, tail sum, known): the arrays the loop's prefix verbs take, read at each call
        (growth replaces them)."""
        index = self.index
        return (index._slot_key, index._slot_block, index._next_copy, index._registered, index._key_of,
                *index._policy.compiled_view(), *self.strategy._chains.compiled_view())

    @property
    def num_keys(self) -> int:
        return self.index._num_keys

    def keys_changed(self, num_keys: int) -> None:
        """Mutates. The loop's table holds `num_keys` keys now."""
        self.index.keys_changed(num_keys - self.index._num_keys)

    def grow_keys(self, more: int) -> None:
        """Mutates. A table with room for `more` keys beyond those it holds (`HashPrefixIndex.insert`'s growth)."""
        self.index._grow_table(self.index._num_keys + more)

    def grow_rows(self, free_rows_top: int) -> None:
        super().grow_rows(free_rows_top)
        self.strategy._chains.fit(self.capacity_rows)

    def cached_blocks(self) -> int:
        return self.strategy._num_cached_blocks()

    def finish(self, free_size: int, free_rows_top: int, counted: np.ndarray) -> None:
        """Mutates the strategy: `CompiledPool.finish` with the cached blocks held by no sequence, and the
        loop's prefix counts (`counted`: prompt tokens queried, tokens hit, blocks evicted) added to its
        counters."""
        s = self.strategy
        super().finish(free_size, free_rows_top, self.cached_blocks())
        queried, hit, evicted = counted.tolist()
        s.prefix_query_tokens += queried
        s.prefix_hit_tokens += hit
        s.prefix_evicted_blocks += evicted
