"""`radix`: `paged` holding a radix-tree prefix index (SGLang's RadixAttention; docs/strategies.md).

The page is the block (`--block-size`, 1 = token granular as SGLang's default `page_size`). A
prompt reuses the longest cached path of full pages from the root; at least its last token is
computed (the same rule as `paged-prefix`, so hit counts compare). A running request locks its
path; eviction takes unlocked leaves in the order of `--eviction` (`prefix.radix_index`), a run of a
node's blocks at a time.
"""

from __future__ import annotations

from workbench.allocators.paged.strategy import PagedStrategy
from workbench.allocators.prefix.host_tier import host_tier_for
from workbench.allocators.prefix.radix_index import RadixPrefixIndex
from workbench.allocators.prefix.shared_tier import SharedTier, shared_tier_for
from workbench.allocators.virtual.pages import KVGeometry
from workbench.presets import DEFAULT_SHARED_LINK_GB_S


class RadixStrategy(PagedStrategy):
    name = "radix"

    def __init__(self, *, capacity_slots: int, block_size: int, max_model_len: int, swap_slots: int = 0,
                 eviction: str = "lru", host_cache_gib: float = 0.0, overlap_load: bool = False,
                 shared_tier_gib: float = 0.0, shared_link_gb_s: float = DEFAULT_SHARED_LINK_GB_S,
                 shared_tier: SharedTier | None = None, geometry: KVGeometry | None = None) -> None:
        """`shared_tier`: the fleet's pool, one object for every replica (`registry.create`); without one a
        `shared_tier_gib` above 0 builds a pool of this strategy's own (a fleet of one)."""
        super().__init__(capacity_slots=capacity_slots, block_size=block_size, max_model_len=max_model_len,
                         swap_slots=swap_slots, prefix_index=RadixPrefixIndex(eviction),
                         host_tier=host_tier_for(host_cache_gib, block_size, geometry),
                         shared_tier=shared_tier if shared_tier is not None
                         else shared_tier_for(shared_tier_gib, block_size, geometry))
        self.overlap_load = overlap_load  # the clock's: host-tier loads overlap compute (allocators.base)
        self.shared_link_gb_s = shared_link_gb_s  # the clock's: a shared-tier promote crosses this link
