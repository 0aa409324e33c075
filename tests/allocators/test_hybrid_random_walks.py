"""Random operation walks over every strategy's hybrid form (docs/hybrid.md): admit, append, fork and free at
random on pools of sliding-window and full-attention layer groups, prompts sharing prefixes so a prefix cache
hits (window blocks too), every group's partition checked against the model after each operation."""

from __future__ import annotations

import numpy as np
import pytest
from hybrid_model import HybridPoolModel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from walk_ops import BLOCK_SIZES, append_or_refuse, continuation, pool_sizes, shared_prompt, walk_configs

from workbench.allocators import registry
from workbench.presets import MODELS

# Hybrid geometries, (window_tokens or None, units) per layer group: the gpt-oss preset's own groups,
# and windows small enough to slide inside these walks' lengths (W = 1, a window inside one block, a
# window across blocks), with several units per group as in Gemma 3 (52 + 10 layers = 26 + 5 units).
HYBRID_GEOMETRIES = (
    tuple((g.window_tokens, g.num_layers // MODELS["gpt-oss-20b"].unit_layers())
          for g in MODELS["gpt-oss-20b"].groups()),
    ((1, 1), (None, 1)),
    ((7, 2), (None, 1)),
    ((40, 1),),
    ((5, 3), (24, 1), (None, 2)),
)


def _hybrid_options(reg: registry.Registration, every_choice: bool) -> list[dict]:
    """Option sets walked on a hybrid geometry: every choice on the preset's own geometry, else defaults."""
    if every_choice:  # the choices of the options its hybrid form takes (registry.hybrid_options)
        return [options for bs, options in walk_configs(reg) if bs == BLOCK_SIZES[0]
                and all(v == registry.option_default(o) for o, v in options.items()
                        if o not in registry.hybrid_options(reg))]
    return [{o: registry.option_default(o) for o in reg.options}]


def _hybrid_configs(name: str) -> list:
    """pytest params over block sizes x geometries x option sets. The quick run walks every (geometry,
    option set) once, at block sizes taken in turn (so each block size is met); the rest of the cross, the
    same walks at other block sizes, is marked slow and runs in the full run."""
    walks = [(geometry, options) for geometry in HYBRID_GEOMETRIES
             for options in _hybrid_options(registry.get(name), geometry is HYBRID_GEOMETRIES[0])]
    sizes = BLOCK_SIZES[:3]
    return [pytest.param(name, bs, geometry, options, marks=() if j == k % len(sizes) else pytest.mark.slow)
            for j, bs in enumerate(sizes) for k, (geometry, options) in enumerate(walks)]


HYBRID_CONFIGS = [param for name in registry.hybrid_names() for param in _hybrid_configs(name)]


def _check_hybrid(model: HybridPoolModel) -> None:
    s = model.s
    s.check_integrity()
    groups = s.group_snapshots()
    assert [(g.token_slots, g.reserved_slots, g.internal_frag_slots, g.held_slots)
            for g in groups] == model.reference_partition()
    snap = s.snapshot()
    assert sum(g.held_slots for g in groups) + snap.cached_slots + snap.free_slots == s.capacity_slots
    assert snap.token_slots == sum(g.token_slots for g in groups)
    assert snap.num_free_blocks * s.block_size == snap.free_slots + snap.cached_slots
    model.verify()


def hybrid_walk(name: str, block_size: int, geometry: tuple, seed: int, num_ops: int = 200,
                options: dict | None = None) -> None:
    """Admit, append, fork and free at random on a hybrid pool, checking every group after each step.
    Prompts share prefixes and continue freed sequences, so a prefix cache hits (window blocks too)."""
    rng = np.random.default_rng(seed)
    capacity, max_len = pool_sizes(block_size)
    s = registry.create_hybrid(name, capacity_slots=capacity * 2, block_size=block_size, max_model_len=max_len,
                               groups=geometry, **(options or {}))
    model = HybridPoolModel(s)
    prefixes = [rng.integers(0, 1000, max_len) for _ in range(3)]
    seen: list[np.ndarray] = []  # token ids of freed sequences
    next_id = 0
    for _ in range(num_ops):
        op = rng.choice(["admit", "append", "append", "append", "append", "fork", "free"])
        live = list(model.tokens)
        if op == "admit":
            if seen and rng.random() < 0.4:
                prompt = continuation(rng, seen[int(rng.integers(len(seen)))], max_len // 2)
            else:
                prompt = shared_prompt(rng, prefixes, max_len // 3)
            final = int(rng.integers(prompt.shape[0], max_len + 1))
            ids = list(range(next_id, next_id + int(rng.integers(1, 4))))
            before = s.snapshot()
            if model.admit(ids, prompt, final).admitted:
                next_id += len(ids)
            else:
                assert s.snapshot() == before, "a refused admission changed the pool"
        elif op == "append" and live:
            batch = [i for i in live if len(model.tokens[i]) < model.final[i] and rng.random() < 0.8]
            if not batch:
                continue
            if not append_or_refuse(s, model, batch, rng):
                model.free(batch[-1])
        elif op == "fork" and live:
            model.fork(live[int(rng.integers(len(live)))], next_id)
            next_id += 1
        elif op == "free" and live:
            seq_id = live[int(rng.integers(len(live)))]
            seen.append(np.array(model.tokens[seq_id]))
            model.free(seq_id)
        _check_hybrid(model)
    for seq_id in list(model.tokens):
        model.free(seq_id)
        _check_hybrid(model)
    snap = s.snapshot()
    assert snap.free_slots + snap.cached_slots == s.capacity_slots


@pytest.mark.parametrize("name,block_size,geometry,options", HYBRID_CONFIGS)
@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_hybrid_random_walk_keeps_every_invariant_per_group(name, block_size, geometry, options, seed):
    hybrid_walk(name, block_size, geometry, seed, options=options)


@pytest.mark.slow
@pytest.mark.parametrize("name,block_size,geometry,options", HYBRID_CONFIGS)
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_more_hybrid_random_walks_keep_every_invariant_per_group(name, block_size, geometry, options, seed):
    hybrid_walk(name, block_size, geometry, seed, num_ops=300, options=options)
