"""The host tier of the prefix caches (`--host-cache-gib`): a scripted demote/promote with the block ids
written by hand, sizing, and which strategies take the option. The random walks
(test_random_walks.py) cover every prefix cache × eviction policy with the tier on."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.allocators import registry
from workbench.allocators.values import NO_EFFECTS, SeqSpec
from workbench.allocators.virtual.pages import KVGeometry
from workbench.config import RunConfig

HOST_TIERED = [r.name for r in registry.registrations() if "host_cache_gib" in r.options]
# one layer whose K (or V) row is 2^28 bytes: a block of 2 tokens is 2 × 2^28 × 2 bytes = 1 GiB
GIB_PER_BLOCK = KVGeometry(num_layers=1, buffer_bytes_per_token=2**28)


def _tiered(name: str, host_blocks: int, **options):
    return registry.create(name, capacity_slots=8, block_size=2, max_model_len=8, geometry=GIB_PER_BLOCK,
                           host_cache_gib=float(host_blocks), **options)


def _admit(s, seq_id: int, prompt: list[int]) -> int:
    result = s.admit([seq_id], SeqSpec(np.array(prompt, dtype=np.int32), len(prompt)))
    assert result.admitted
    return result.cached_tokens


def _moves(s):
    """The step's (demotes, promotes) as the engine takes them."""
    effects = s.end_step()
    return effects.demote, effects.promote


def test_every_prefix_cache_takes_a_host_tier():
    assert HOST_TIERED and set(HOST_TIERED) == {r.name for r in registry.registrations() if r.prefix_cache}


@pytest.mark.parametrize("name", HOST_TIERED)
def test_scripted_demote_then_promote_moves_the_blocks_written_by_hand(name):
    """4 device blocks of 2 tokens, 3 host blocks. A's two full blocks are evicted by B and demoted;
    C repeats A's prefix, so they are promoted while B's blocks are demoted in turn."""
    s = _tiered(name, 3)
    assert s.host_tier_blocks == 3
    assert _admit(s, 0, [1, 2, 3, 4, 5]) == 0  # blocks 0 [1 2], 1 [3 4] registered; 2 holds [5]
    s.free(0)  # 0 and 1 cached (1, the tail, to go first); 2 back on the free stack
    demote, promote = _moves(s)
    assert demote.shape == promote.shape == (0, 2)
    assert _admit(s, 1, [9] * 7) == 0  # 4 blocks: free 2 and 3, then evicts 1 and 0
    demote, promote = _moves(s)
    assert demote.tolist() == [[1, 0], [0, 1]]  # (device, host): A's [3 4] to host 0, [1 2] to host 1
    assert promote.tolist() == []
    assert s.tables.blocks_of(s.tables.seqs.row(1)).tolist() == [2, 3, 1, 0]
    s.free(1)  # B's full blocks 2, 3, 1 cached (1 first to go, then 3); 0 free
    # C: no device hit; A's two blocks in the host tier (at most (5 - 1) // 2 = 2 may hit)
    assert _admit(s, 2, [1, 2, 3, 4, 7]) == 4
    demote, promote = _moves(s)
    # fresh blocks: 0 from the free stack, then 1 and 3 evicted. Block 1 ([9 9], B's third) goes to the free
    # host block 2; block 3 ([9 9], B's second) finds none free (hosts 0 and 1 are read this step) and none to
    # replace (host 2 is written this step: one step never writes a host block twice), so it is dropped
    assert demote.tolist() == [[1, 2]]
    assert promote.tolist() == [[1, 0], [0, 1]]  # (host, device): [1 2] into block 0, [3 4] into block 1
    assert s.tables.blocks_of(s.tables.seqs.row(2)).tolist() == [0, 1, 3]
    assert (s.prefix_hit_tokens, s.prefix_hit_tokens_host) == (0, 4)
    assert s.host_tier.num_used() == 1 and s.host_tier.promoted_blocks == 2 and s.host_tier.demoted_blocks == 3
    s.check_integrity()
    # the promoted blocks are device blocks again: the same prefix now hits on the device
    assert _admit(s, 3, [1, 2, 3, 4, 8]) == 4 and s.prefix_hit_tokens == 4
    assert _moves(s)[1].tolist() == []


@pytest.mark.parametrize("name", HOST_TIERED)
def test_without_a_host_tier_nothing_moves_and_evictions_drop(name):
    s = registry.create(name, capacity_slots=8, block_size=2, max_model_len=8)
    assert s.host_tier_blocks == 0 and s.end_step() is NO_EFFECTS
    _admit(s, 0, [1, 2, 3, 4, 5])
    s.free(0)
    _admit(s, 1, [9] * 7)
    s.free(1)
    assert _admit(s, 2, [1, 2, 3, 4, 7]) == 0  # evicted and dropped: recomputed


def test_host_tier_size_is_gib_over_the_models_bytes_per_block():
    geometry = KVGeometry.of("llama-3-8b", "fp16")  # 131,072 bytes per token
    s = registry.create("paged-prefix", capacity_slots=4096, block_size=16, max_model_len=1024, geometry=geometry,
                        host_cache_gib=1.0)
    assert s.host_tier_blocks == 2**30 // (131_072 * 16) == 512
    with pytest.raises(ValueError, match="holds no KV block"):
        registry.create("paged-prefix", capacity_slots=4096, block_size=16, max_model_len=1024, geometry=geometry,
                        host_cache_gib=1e-6)


def test_strategies_without_a_prefix_cache_reject_the_host_tier_options():
    for reg in registry.registrations():
        if reg.name in HOST_TIERED:
            registry.check_options(RunConfig(strategy=reg.name, host_cache_gib=1.0, overlap_load=True))
            continue
        for option in ({"host_cache_gib": 1.0}, {"overlap_load": True}):
            with pytest.raises(ValueError, match="does not apply to strategy"):
                registry.check_options(RunConfig(strategy=reg.name, **option))
