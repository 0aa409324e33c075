"""The string-keyed registry: every name builds a strategy that speaks the protocol."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.allocators import registry
from workbench.allocators.base import ContiguousDescriptor, PagedDescriptor, SeqSpec


def test_names_are_the_design_strategies():
    assert registry.names() == ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged", "paged-prefix"]


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown strategy 'vattention'; valid: contiguous-max, .*paged-prefix"):
        registry.create("vattention", capacity_slots=100, max_model_len=10)


def test_unknown_fit_is_an_error():
    with pytest.raises(ValueError, match="unknown fit 'worst'"):
        registry.create("contiguous-max", capacity_slots=100, fit="worst", max_model_len=10)


@pytest.mark.parametrize("name", registry.names())
def test_every_strategy_admits_appends_describes_and_frees(name):
    s = registry.create(name, capacity_slots=256, block_size=16, max_model_len=64)
    assert s.name == name
    expected = PagedDescriptor if s.kernel_mode == "paged" else ContiguousDescriptor
    assert s.block_size == (16 if s.kernel_mode == "paged" else 1)
    assert s.admit([3], SeqSpec(np.arange(20, dtype=np.int32), 30)).admitted
    assert s.append([3]).slots.dtype == np.int64
    assert isinstance(s.describe([3]), expected)
    assert s.snapshot().token_slots == 21
    s.free(3)
    snap = s.snapshot()
    assert snap.free_slots + snap.cached_slots == 256
    assert s.prefix_query_tokens == (20 if name == "paged-prefix" else 0) and s.prefix_hit_tokens == 0
    s.check_integrity()
