"""Adding a strategy is one class plus one registration, and every generic check then covers it.

The strategy here is real, not a stub: `paged` handing out free blocks highest id first (a fresh
`paged` pool hands out 0, 1, 2, ...). It is registered for the test only.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_random_walks import random_walk
from test_registry import check_protocol_basics
from walk_ops import walk_configs

from tests.engine.test_engine_strategies import WORKLOADS, verify_with_kernels
from tests.figures.test_strategy_style import check_strategy_style
from workbench.allocators import registry
from workbench.allocators.paged.strategy import PagedStrategy
from workbench.allocators.values import SeqSpec


class HighFirstPaged(PagedStrategy):
    name = "paged-high-first"

    def __init__(self, *, capacity_slots: int, block_size: int, max_model_len: int, swap_slots: int = 0) -> None:
        super().__init__(capacity_slots=capacity_slots, block_size=block_size, max_model_len=max_model_len,
                         swap_slots=swap_slots)
        self._free.push(self._free.pop(self._free.size)[::-1])  # highest id on top


REGISTRATION = registry.Registration(
    "paged-high-first", f"{__name__}:HighFirstPaged", kernel_mode="paged", family="paged",
    label="Paged (high first)", tick_label="Paged\nhigh", color="#009E73", marker="P")


@pytest.fixture
def plugin():
    registry.register(REGISTRATION)
    yield REGISTRATION.name
    registry.unregister(REGISTRATION.name)
    assert REGISTRATION.name not in registry.names()


def test_a_registered_strategy_is_a_real_new_strategy(plugin):
    assert plugin in registry.names() and registry.get(plugin) is REGISTRATION
    s = registry.create(plugin, capacity_slots=64, block_size=4, max_model_len=64)
    assert isinstance(s, HighFirstPaged)
    s.admit([1], SeqSpec(np.arange(9, dtype=np.int32), 12))
    assert s.describe([1]).kv_indices.tolist() == [15, 14, 13]
    with pytest.raises(ValueError, match="takes no option 'fit'"):
        registry.create(plugin, capacity_slots=64, max_model_len=64, fit="best")


def test_the_generic_allocator_checks_cover_a_registered_strategy(plugin):
    configs = walk_configs(registry.get(plugin))
    assert [bs for bs, _ in configs] == [1, 3, 16, 256]
    for seed, (block_size, options) in enumerate(configs):
        random_walk(plugin, block_size, options, seed, num_ops=150)
    check_protocol_basics(plugin)


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_the_engine_verifies_a_registered_strategy_with_kernels(plugin, workload):
    verify_with_kernels(plugin, workload)


def test_figures_style_a_registered_strategy(plugin):
    check_strategy_style(plugin)
