"""The registry: every registration builds a strategy that speaks the protocol; options are checked."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.allocators import registry
from workbench.allocators.values import ContiguousDescriptor, PagedDescriptor, SeqSpec
from workbench.config import RunConfig


def test_unknown_name_lists_the_valid_ones():
    valid = ", ".join(registry.names())
    with pytest.raises(ValueError, match=f"unknown strategy 'vattention'; valid: {valid}$"):
        registry.create("vattention", capacity_slots=100, max_model_len=10)


def test_an_undeclared_option_is_refused_in_one_line():
    for reg in registry.registrations():
        if "fit" not in reg.options:
            with pytest.raises(ValueError, match=f"strategy '{reg.name}' takes no option 'fit' "
                                                 rf"\(it takes: {', '.join(reg.options) or 'none'}\)"):
                registry.create(reg.name, capacity_slots=100, max_model_len=10, fit="first")


def test_an_invalid_option_value_is_an_error():
    takers = [reg.name for reg in registry.registrations() if "fit" in reg.options]
    assert takers
    with pytest.raises(ValueError, match="unknown fit 'worst'; valid: first, best, buddy"):
        registry.create(takers[0], capacity_slots=100, fit="worst", max_model_len=10)


def test_a_run_setting_an_option_its_strategy_does_not_take_is_refused():
    takers = [reg.name for reg in registry.registrations() if "fit" in reg.options]
    for reg in registry.registrations():
        cfg = RunConfig(strategy=reg.name, fit="best")
        if "fit" in reg.options:
            registry.check_options(cfg)
        else:
            with pytest.raises(ValueError, match=f"--fit best does not apply to strategy '{reg.name}'; "
                                                 f"it is taken by: {', '.join(takers)}"):
                registry.check_options(cfg)
        registry.check_options(RunConfig(strategy=reg.name))  # defaults are always fine


def test_registering_twice_or_an_unknown_option_is_refused():
    reg = registry.get(registry.names()[0])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(reg)
    with pytest.raises(ValueError, match="not RunConfig fields"):
        registry.register(registry.Registration("x", reg.factory, "paged", "paged", "X", "X", "#000000", "o",
                                                options=("placement",)))
    assert "x" not in registry.names()


def check_protocol_basics(name: str) -> None:
    """A fresh instance admits, appends, describes, frees and accounts as its registration says."""
    reg = registry.get(name)
    s = registry.create(name, capacity_slots=256, block_size=16, max_model_len=64)
    assert s.name == name and s.kernel_mode == reg.kernel_mode
    expected = PagedDescriptor if s.kernel_mode == "paged" else ContiguousDescriptor
    assert s.block_size == (16 if reg.block_sized else 1)
    assert 64 <= s.capacity_slots <= 256  # whole blocks or pages of the 256 slots' memory
    assert s.num_allocatable_blocks() * s.block_size == s.capacity_slots
    assert s.admit([3], SeqSpec(np.arange(20, dtype=np.int32), 30)).admitted
    assert s.append([3]).slots.dtype == np.int64
    assert isinstance(s.describe([3]), expected)
    assert s.snapshot().token_slots == 21
    assert s.num_allocatable_blocks() == s.snapshot().num_free_blocks
    s.free(3)
    snap = s.snapshot()
    assert snap.free_slots + snap.cached_slots == s.capacity_slots
    assert s.num_allocatable_blocks() * s.block_size == s.capacity_slots
    assert s.prefix_query_tokens == (20 if reg.prefix_cache else 0) and s.prefix_hit_tokens == 0
    s.check_integrity()


@pytest.mark.parametrize("name", registry.names())
def test_every_strategy_admits_appends_describes_and_frees(name):
    check_protocol_basics(name)
