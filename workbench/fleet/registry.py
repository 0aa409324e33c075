"""The routers by name (config.ROUTER_NAMES)."""

from __future__ import annotations

from workbench.config import ROUTER_NAMES
from workbench.fleet.cache_aware import CacheAware
from workbench.fleet.routers import KVExact, LeastLoaded, PowerOfTwo, RoundRobin, Router, Session

ROUTERS: dict[str, type[Router]] = {cls.name: cls for cls in (RoundRobin, LeastLoaded, PowerOfTwo, Session,
                                                               CacheAware, KVExact)}
assert tuple(ROUTERS) == ROUTER_NAMES, "config.ROUTER_NAMES and the router classes disagree"


def make_router(name: str, num_replicas: int, *, block_size: int, seed: int, overlap_weight: float = 1.0) -> Router:
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}; expected one of {', '.join(ROUTERS)}")
    return ROUTERS[name](num_replicas, block_size=block_size, seed=seed, overlap_weight=overlap_weight)
