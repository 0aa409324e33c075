"""`radix`'s compressed tree against the same tree block by block (`radix_reference`): random walks of
admissions (shared heads, continuations of freed sequences, chunked prompts), decode appends with and
without token ids, forks and frees drive two pools, one per index; after every operation both pools pass
their integrity checks and agree on every observable: admission results, every live table, the free and
cached blocks, the eviction order and the counters."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from radix_reference import ReferenceRadixIndex

from workbench.allocators import registry
from workbench.allocators.prefix.eviction import POLICIES, make_policy
from workbench.allocators.prefix.prefix_cache import PrefixCacheStrategy
from workbench.allocators.values import SeqSpec

MAX_LEN = 90


def _pools(eviction: str, block_size: int, capacity_blocks: int):
    capacity = capacity_blocks * block_size
    fast = registry.create("radix", capacity_slots=capacity, block_size=block_size, max_model_len=MAX_LEN,
                           eviction=eviction)
    slow = PrefixCacheStrategy(name="radix", index=ReferenceRadixIndex(make_policy(eviction)),
                               capacity_slots=capacity, block_size=block_size, max_model_len=MAX_LEN)
    return fast, slow


def _agree(fast, slow, live: list[int]) -> None:
    fast.check_integrity()
    slow.check_integrity()
    assert fast.cached_block_ids().tolist() == slow.cached_block_ids().tolist()
    assert np.array_equal(fast._free.ids(), slow._free.ids())
    assert sorted(fast.registered_block_ids().tolist()) == sorted(slow.registered_block_ids().tolist())
    assert fast.counters() == slow.counters()
    assert fast.snapshot() == slow.snapshot()
    for seq_id in live:
        assert fast.describe([seq_id]).kv_indices.tolist() == slow.describe([seq_id]).kv_indices.tolist()


def radix_walk(eviction: str, block_size: int, seed: int, num_ops: int) -> None:
    rng = np.random.default_rng(seed)
    pools = _pools(eviction, block_size, capacity_blocks=int(rng.integers(12, 40)) * 4 // block_size + 8)
    heads = [rng.integers(0, 50, MAX_LEN) for _ in range(3)]
    tokens: dict[int, list[int]] = {}  # live id -> its tokens
    final: dict[int, int] = {}
    pending: dict[int, np.ndarray] = {}  # a chunked prompt's id -> its tokens still to come
    seen: list[list[int]] = []
    next_id = 0
    for _ in range(num_ops):
        op = rng.choice(["admit", "admit", "extend", "append", "append", "append", "fork", "free"])
        ready = [i for i in tokens if i not in pending and len(tokens[i]) < final[i]]
        if op == "admit":
            if seen and rng.random() < 0.5:
                base = seen[int(rng.integers(len(seen)))]
                prompt = np.array(base[:int(rng.integers(1, len(base) + 1))] + rng.integers(0, 50, 5).tolist())
            else:
                prompt = np.concatenate([heads[int(rng.integers(3))][:int(rng.integers(0, 40))],
                                         rng.integers(0, 50, int(rng.integers(1, 20)))])
            prompt = prompt[:MAX_LEN - 1].astype(np.int32)
            spec = SeqSpec(prompt, int(rng.integers(prompt.shape[0], MAX_LEN + 1)))
            if rng.random() < 0.4:
                spec = SeqSpec(prompt, spec.final_len, num_new_tokens=int(rng.integers(1, prompt.shape[0] + 1)))
            results = [p.admit([next_id], spec) for p in pools]
            assert results[0] == results[1]
            if results[0].admitted:
                held = spec.num_held(results[0].cached_tokens)
                tokens[next_id], final[next_id] = prompt[:held].tolist(), spec.final_len
                if held < prompt.shape[0]:
                    pending[next_id] = prompt[held:]
                next_id += 1
        elif op == "extend" and pending:
            seq_id = next(iter(pending))
            rest = pending.pop(seq_id)
            chunk = rest[:int(rng.integers(1, rest.shape[0] + 1))]
            results = [p.extend([seq_id], chunk) for p in pools]
            assert results[0] == results[1]
            if results[0].admitted:
                tokens[seq_id] += chunk.tolist()
                rest = rest[chunk.shape[0]:]
            if rest.shape[0]:
                pending[seq_id] = rest
        elif op == "append" and ready:
            batch = [i for i in ready if rng.random() < 0.7] or ready[:1]
            if not all(p.can_append(batch) for p in pools):
                assert not any(p.can_append(batch) for p in pools)
                victim = batch[-1]
                seen.append(tokens.pop(victim))
                for p in pools:
                    p.free(victim)
                batch = []
            if batch:
                new = rng.integers(0, 50, len(batch)).astype(np.int32)
                ids = None if rng.random() < 0.05 else new
                results = [p.append(batch, ids) for p in pools]
                assert np.array_equal(results[0].slots, results[1].slots)
                assert np.array_equal(results[0].copies, results[1].copies)
                for i, t in zip(batch, new.tolist(), strict=True):
                    tokens[i].append(t)
        elif op == "fork" and ready:
            parent = ready[int(rng.integers(len(ready)))]
            results = [p.fork(parent, next_id) for p in pools]
            assert results[0] == results[1]
            tokens[next_id], final[next_id] = list(tokens[parent]), final[parent]
            next_id += 1
        elif op == "free" and tokens:
            seq_id = list(tokens)[int(rng.integers(len(tokens)))]
            pending.pop(seq_id, None)
            seen.append(tokens.pop(seq_id))
            for p in pools:
                p.free(seq_id)
        _agree(*pools, list(tokens))
    for seq_id in list(tokens):
        for p in pools:
            p.free(seq_id)
        _agree(*pools, [])


@pytest.mark.parametrize("eviction", list(POLICIES))
@pytest.mark.parametrize("block_size", [1, 2, 4])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_compressed_radix_matches_the_block_by_block_tree(eviction, block_size, seed):
    radix_walk(eviction, block_size, seed, num_ops=150)


@pytest.mark.slow
@pytest.mark.parametrize("eviction", list(POLICIES))
@pytest.mark.parametrize("block_size", [1, 3])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_long_compressed_radix_walks_match_the_block_by_block_tree(eviction, block_size, seed):
    radix_walk(eviction, block_size, seed, num_ops=400)
