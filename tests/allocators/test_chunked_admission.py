"""Chunked prefill on the strategy side: an admission of a first chunk followed by `extend` calls ends
exactly where an admission of the whole prompt does (same accounting, same prefix-cache hits and
registrations), for every registered strategy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.allocators.alloc_model import PoolModel
from workbench.allocators import registry
from workbench.allocators.values import SeqSpec

MAX_LEN = 300


def _pair(reg: registry.Registration) -> tuple[PoolModel, PoolModel]:
    bs = 4 if reg.block_sized else 1
    make = lambda: registry.create(reg.name, capacity_slots=12_000, block_size=bs, max_model_len=MAX_LEN)  # noqa: E731
    return PoolModel(make()), PoolModel(make())


def _chunks(rng: np.random.Generator, num_tokens: int) -> list[int]:
    """Random chunk sizes adding up to at least `num_tokens` (the first is an admission's budget)."""
    sizes = []
    while sum(sizes) < num_tokens:
        sizes.append(int(rng.integers(1, 40)))
    return sizes


@pytest.mark.parametrize("name", registry.names())
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_chunks_end_where_a_whole_admission_ends(name, seed):
    rng = np.random.default_rng(seed)
    whole, chunked = _pair(registry.get(name))
    shared = rng.integers(0, 1000, MAX_LEN)  # prompts share prefixes, so a prefix cache hits
    live: list[list[int]] = []
    next_id = 0
    for _ in range(12):
        length = int(rng.integers(1, MAX_LEN - 10))
        prompt = np.concatenate([shared[:int(rng.integers(0, length + 1))], rng.integers(0, 1000, length)])[:length]
        final = int(rng.integers(length, MAX_LEN + 1))
        ids = list(range(next_id, next_id + int(rng.integers(1, 4))))
        next_id += len(ids)
        expected = whole.admit(ids, prompt, final)
        assert expected.admitted
        sizes = _chunks(rng, length)
        got = chunked.admit(ids, prompt, final, sizes[0])
        assert got.admitted and got.cached_tokens == expected.cached_tokens
        held = SeqSpec(prompt, final, sizes[0]).num_held(got.cached_tokens)
        for size in sizes[1:]:
            if held == length:
                break
            assert chunked.extend(ids, prompt[held:held + size]).admitted
            held = min(length, held + size)
            chunked.s.check_integrity()
            chunked.verify()
        assert chunked.s.snapshot() == whole.s.snapshot()
        assert (chunked.s.prefix_query_tokens, chunked.s.prefix_hit_tokens) == \
               (whole.s.prefix_query_tokens, whole.s.prefix_hit_tokens)
        chunked.verify()
        live.append(ids)
        if rng.random() < 0.5:  # freed blocks stay cached where a prefix cache registered them
            for seq_id in live.pop(int(rng.integers(len(live)))):
                whole.free(seq_id)
                chunked.free(seq_id)
            assert chunked.s.snapshot() == whole.s.snapshot()


@pytest.mark.parametrize("name", registry.names())
def test_extend_past_the_final_length_or_of_a_forked_group_is_an_error(name):
    whole, _ = _pair(registry.get(name))
    prompt = np.arange(10)
    assert whole.admit([0, 1], prompt, 12, num_new_tokens=4).admitted
    with pytest.raises(ValueError, match="final length"):
        whole.s.extend([0, 1], np.arange(9, dtype=np.int32))
    assert whole.extend([0, 1], prompt[4:]).admitted
    whole.append([0, 1], np.random.default_rng(0))  # the samples diverge: no longer one prompt
    whole.append([0], np.random.default_rng(1))
    with pytest.raises(ValueError):
        whole.s.extend([0, 1], np.arange(1, dtype=np.int32))
