"""`paged-prefix`: `paged` holding a hash-chain prefix index with LRU eviction (vLLM v1's APC, docs/strategies.md).

A full block (prompt or decode-filled) is registered under its chain key (`prefix.chains`). A later
prompt whose leading blocks have registered keys reuses those blocks (refcount++), so only the rest
is computed. A hit never covers the whole prompt: at least the last prompt token is recomputed, so
the engine has a token to produce logits from (vLLM's rule; a fully cached prompt recomputes its
last block). A registered block whose refcount drops to 0 is *cached*: evictable, reusable by a
hit. New blocks come from never-cached free blocks first; cached ones are evicted in the order of
`--eviction` (default `lru`: least recently used first, a freed request's last block before its
first, vLLM's order; `eviction.py` lists the others).
"""

from __future__ import annotations

from workbench.allocators.paged.strategy import PagedStrategy
from workbench.allocators.prefix.eviction import make_policy
from workbench.allocators.prefix.hash_index import HashPrefixIndex
from workbench.allocators.prefix.host_tier import host_tier_for
from workbench.allocators.prefix.shared_tier import SharedTier, shared_tier_for
from workbench.allocators.virtual.pages import KVGeometry
from workbench.presets import DEFAULT_SHARED_LINK_GB_S


class PagedPrefixStrategy(PagedStrategy):
    name = "paged-prefix"

    def __init__(self, *, capacity_slots: int, block_size: int, max_model_len: int, swap_slots: int = 0,
                 eviction: str = "lru", host_cache_gib: float = 0.0, overlap_load: bool = False,
                 shared_tier_gib: float = 0.0, shared_link_gb_s: float = DEFAULT_SHARED_LINK_GB_S,
                 shared_tier: SharedTier | None = None, geometry: KVGeometry | None = None) -> None:
        """`shared_tier`: the fleet's pool, one object for every replica (`registry.create`); without one a
        `shared_tier_gib` above 0 builds a pool of this strategy's own (a fleet of one)."""
        super().__init__(capacity_slots=capacity_slots, block_size=block_size, max_model_len=max_model_len,
                         swap_slots=swap_slots, prefix_index=HashPrefixIndex(make_policy(eviction)),
                         host_tier=host_tier_for(host_cache_gib, block_size, geometry),
                         shared_tier=shared_tier if shared_tier is not None
                         else shared_tier_for(shared_tier_gib, block_size, geometry))
        self.overlap_load = overlap_load  # the clock's: host-tier loads overlap compute (allocators.base)
        self.shared_link_gb_s = shared_link_gb_s  # the clock's: a shared-tier promote crosses this link

    @staticmethod
    def hybrid_prefix_index(eviction: str = "lru") -> HashPrefixIndex:
        """The index of this strategy's per-layer-group form (`registry.create_hybrid`, docs/hybrid.md): a
        flat hash index also answers a sliding-window group's lookups of one key at a time."""
        return HashPrefixIndex(make_policy(eviction))
