"""What the random walks over the strategies share (`test_random_walks`, `test_hybrid_random_walks`): the
block sizes and option sets walked, pool sizes under pressure, prompts that share prefixes, and an append
that shows a refusal changes nothing."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from workbench.allocators import registry
from workbench.config import RunConfig

BLOCK_SIZES = (1, 3, 16, 256)  # paged kernel mode; contiguous strategies have one slot per block



def append_or_refuse(s, model, batch: list[int], rng) -> bool:
    """Append one token to each of `batch` when the pool can (half of the time through `append_if_room`,
    the scheduler's one call); otherwise show that the refused append raises, that `append_if_room` says
    None, and that both leave the pool as it was. True when appended."""
    if s.can_append(batch):
        model.append(batch, rng, if_room=bool(rng.integers(2)))
        return True
    before = s.snapshot()
    with pytest.raises(RuntimeError):
        s.append(batch)
    assert s.snapshot() == before, "a failed append changed the pool"
    assert s.append_if_room(batch) is None and s.snapshot() == before, "a refused append_if_room changed the pool"
    return False

def walk_configs(reg: registry.Registration) -> list[tuple[int, dict]]:
    """(block size, options) to walk for a registration: every block size if it is block-sized, and
    every combination of its declared options' choices (an unrestricted option takes the values its
    field names under `walk`, else keeps its default)."""
    block_sizes = BLOCK_SIZES if reg.block_sized else (1,)
    choices = [registry.option_choices(o) or _WALK_VALUES.get(o) or (registry.option_default(o),)
               for o in reg.options]
    return [(bs, dict(zip(reg.options, combo, strict=True))) for bs in block_sizes
            for combo in itertools.product(*choices)]


_WALK_VALUES = {f.name: f.metadata["walk"] for f in dataclasses.fields(RunConfig) if "walk" in f.metadata}


def pool_sizes(block_size: int) -> tuple[int, int]:
    """(capacity_slots, max_model_len) giving real pressure at this block size."""
    if block_size == 256:
        return 256 * 14 + 100, 900
    return 700, 120


def shared_prompt(rng: np.random.Generator, prefixes: list[np.ndarray], max_len: int) -> np.ndarray:
    """Prompts often start with one of a few shared prefixes, so prefix hits happen."""
    length = int(rng.integers(1, max_len + 1))
    if rng.random() < 0.6:
        prefix = prefixes[int(rng.integers(len(prefixes)))][:length]
        return np.concatenate([prefix, rng.integers(0, 1000, length - prefix.shape[0])])
    return rng.integers(0, 1000, length)


def continuation(rng: np.random.Generator, tokens: np.ndarray, max_len: int) -> np.ndarray:
    """A prompt that repeats a leading part of `tokens` (often all of it) and goes on with new tokens."""
    keep = tokens.shape[0] if rng.random() < 0.7 else int(rng.integers(1, tokens.shape[0] + 1))
    extra = rng.integers(0, 1000, int(rng.integers(1, 20)))
    return np.concatenate([tokens[:keep], extra])[:max_len]
