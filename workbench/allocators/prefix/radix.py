"""`radix`: `paged` holding a radix-tree prefix index (SGLang's RadixAttention; docs/strategies.md).

The page is the block (`--block-size`, 1 = token granular as SGLang's default `page_size`). A
prompt reuses the longest cached path of full pages from the root; at least its last token is
computed (the same rule as `paged-prefix`, so hit counts compare). A running request locks its
path; eviction takes unlocked leaves in the order of `--eviction` (`prefix.radix_index`).
"""

from __future__ import annotations

from workbench.allocators.paged.strategy import PagedStrategy
from workbench.allocators.prefix.eviction import make_policy
from workbench.allocators.prefix.host_tier import host_tier_for
from workbench.allocators.prefix.radix_index import RadixPrefixIndex
from workbench.allocators.virtual.pages import KVGeometry


class RadixStrategy(PagedStrategy):
    name = "radix"

    def __init__(self, *, capacity_slots: int, block_size: int, max_model_len: int, swap_slots: int = 0,
                 eviction: str = "lru", host_cache_gib: float = 0.0, overlap_load: bool = False,
                 geometry: KVGeometry | None = None) -> None:
        super().__init__(capacity_slots=capacity_slots, block_size=block_size, max_model_len=max_model_len,
                         swap_slots=swap_slots, prefix_index=RadixPrefixIndex(make_policy(eviction)),
                         host_tier=host_tier_for(host_cache_gib, block_size, geometry))
        self.overlap_load = overlap_load  # the clock's: host-tier loads overlap compute (allocators.base)
