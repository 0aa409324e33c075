"""Strategies by stable name (DESIGN §4). A new strategy is one module plus one line in `_STRATEGIES`.

Factories import their module only when asked for, so naming a strategy costs nothing until it is
built. Every strategy class takes the same keyword arguments; each ignores what does not apply to it
(contiguous strategies have block size 1 and no swap; paged ones have no placement policy).
"""

from __future__ import annotations

import importlib

from workbench.allocators.base import Strategy

_STRATEGIES = {  # name -> "module:class"
    "contiguous-max": "workbench.allocators.contiguous_max:ContiguousMax",
    "contiguous-pow2": "workbench.allocators.contiguous_pow2:ContiguousPow2",
    "contiguous-oracle": "workbench.allocators.contiguous_oracle:ContiguousOracle",
    "paged": "workbench.allocators.paged:PagedStrategy",
    "paged-prefix": "workbench.allocators.paged_prefix:PagedPrefixStrategy",
}

FITS = ("first", "best", "buddy")


def names() -> list[str]:
    return list(_STRATEGIES)


def create(name: str, *, capacity_slots: int, block_size: int = 16, fit: str = "first", max_model_len: int,
           swap_slots: int = 0, pow2_round: str = "final") -> Strategy:
    """A fresh strategy instance (its counters, e.g. prefix hits, start at zero)."""
    if name not in _STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(_STRATEGIES)}")
    if fit not in FITS:
        raise ValueError(f"unknown fit {fit!r}; valid: {', '.join(FITS)}")
    module, cls = _STRATEGIES[name].split(":")
    factory = getattr(importlib.import_module(module), cls)
    options = {}
    if pow2_round != "final":
        if name != "contiguous-pow2":
            raise ValueError(f"pow2_round is an option of contiguous-pow2, not of {name}")
        options["pow2_round"] = pow2_round
    return factory(capacity_slots=capacity_slots, block_size=block_size, fit=fit, max_model_len=max_model_len,
                   swap_slots=swap_slots, **options)
