"""Per-layer-group allocation: window groups release what their queries cannot read."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.allocators import registry
from workbench.allocators.values import SeqSpec
from workbench.config import RunConfig
from workbench.intmath import cdiv


@pytest.mark.parametrize("block_size", [1, 16, 48, 128, 256])
def test_a_10000_token_sequence_holds_a_window_of_blocks_at_every_step(block_size):
    s = registry.create_hybrid("paged", capacity_slots=10_240 * 3, block_size=block_size, max_model_len=10_000,
                               groups=((128, 1), (None, 1)))
    s.admit([0], SeqSpec(np.zeros(1, dtype=np.int32), 10_000))
    window, full = s.groups
    peak = 0
    for length in range(1, 10_000):
        s.append([0])
        peak = max(peak, len(window.live(0)))
        assert len(window.live(0)) <= cdiv(128, block_size) + 1
        assert len(full.live(0)) == cdiv(length + 1, block_size)
    assert peak == cdiv(128 - 1, block_size) + 1  # W positions span at most this many blocks, and do
    s.check_integrity()
    held = s.group_snapshots()
    assert held[0].held_slots == len(window.live(0)) * block_size
    assert held[1].held_slots == cdiv(10_000, block_size) * block_size


def test_units_multiply_the_blocks_of_a_group():
    s = registry.create_hybrid("paged", capacity_slots=200 * 16, block_size=16, max_model_len=100,
                               groups=((8, 26), (None, 5)))
    s.admit([0, 1], SeqSpec(np.arange(40, dtype=np.int32), 100))
    assert s.num_allocatable_blocks() == 200 - 3 * 31  # one prompt of 3 blocks, shared by both samples
    # the window group drops blocks 0 and 1 (positions < 40 − 8 + 1 = 33); sample 0 copies the shared
    # last block in both groups, sample 1 (its last holder) writes in place
    s.append([0, 1])
    assert s.num_allocatable_blocks() == 200 - 3 * 31 + 2 * 26 - 26 - 5
    g = s.group_snapshots()
    assert g[0].held_slots == 2 * 26 * 16 and g[1].held_slots == (3 + 1) * 5 * 16
    s.check_integrity()


@pytest.mark.parametrize("name", [r.name for r in registry.registrations() if r.name not in registry.hybrid_names()])
def test_strategies_without_a_hybrid_form_are_refused(name):
    with pytest.raises(ValueError, match="--hybrid off"):
        registry.create_hybrid(name, capacity_slots=64, block_size=16, max_model_len=32, groups=((8, 1),))


def test_the_paged_family_has_a_hybrid_form():
    assert "paged" in registry.hybrid_names()


@pytest.mark.parametrize("name", [r.name for r in registry.registrations()
                                  if r.name in registry.hybrid_names() and "host_cache_gib" in r.options])
def test_a_host_tier_on_a_hybrid_pool_is_refused_and_its_default_runs(name):
    """The host tier serves the one-table prefix cache: asked for on a hybrid model, one line says so;
    left at its default, the hybrid form is built from the run's options."""
    with pytest.raises(ValueError, match="--host-cache-gib 1.0 with --hybrid on"):
        registry.check_options(RunConfig(strategy=name, model="gpt-oss-20b", host_cache_gib=1.0))
    cfg = RunConfig(strategy=name, model="gpt-oss-20b", max_model_len=2048, kv_slots=4096, eviction="fifo")
    registry.check_options(cfg)
    strategy = registry.create_from_config(cfg, cfg.resolve())
    assert strategy.num_allocatable_blocks() > 0
    with pytest.raises(ValueError, match="--host-cache-gib 1.0 with --hybrid on"):
        registry.create_hybrid(name, capacity_slots=64, block_size=16, max_model_len=32, groups=((8, 1),),
                               host_cache_gib=1.0)
