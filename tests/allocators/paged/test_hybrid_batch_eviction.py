"""The hybrid pool evicts cached entries in batches, and a decode step's group takes its blocks and releases
what left its windows at once; the same pool evicting one entry per step of its loop, each sequence taking
and releasing its own blocks (`OneAtATime`, the pool as vLLM's free queue hands blocks out), is the
reference. Random walks with shared heads, continuations and a pool small enough to evict drive both; after
every operation both pass their integrity checks and agree on every observable: admission results, slots
and copies, every group's tables, the free stack in order, the cached entries in eviction order and the
counters."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.allocators import registry
from workbench.allocators.paged.hybrid import HybridPaged
from workbench.allocators.prefix.eviction import POLICIES
from workbench.allocators.prefix.prefix_cache import PAGED_PREFIX
from workbench.allocators.values import SeqSpec

MAX_LEN = 120
GEOMETRIES = (((7, 1), (None, 1)), ((5, 2), (None, 1)), ((3, 1), (20, 2), (None, 3)))


class OneAtATime(HybridPaged):
    def _take(self, k: int, group: int) -> np.ndarray:
        while self._free.size < k and self.prefix is not None:
            entry = self.prefix.evict(1)[0]
            self.prefix_evicted_blocks += entry.shape[0]
            self._free.push(entry)
        taken = self._free.pop(k)
        self._group_of_block[taken] = group
        return taken

    def _take_each(self, k: int, units: int, group: int) -> np.ndarray:  # each sequence's take, in turn
        taken = [self._take(units, group) for _ in range(k // units)]
        return np.concatenate(taken) if taken else np.zeros(0, dtype=np.int32)

    def _release_passed(self, group: int, runs: list[list[np.ndarray]]) -> None:  # each sequence's, in turn
        for run in runs:
            self._drop(run, group)


def _pools(geometry, eviction: str, block_size: int, capacity_slots: int):
    batched = registry.create_hybrid("paged-prefix", capacity_slots=capacity_slots, block_size=block_size,
                                     max_model_len=MAX_LEN, groups=geometry, eviction=eviction)
    single = OneAtATime(capacity_slots=capacity_slots, block_size=block_size, max_model_len=MAX_LEN,
                        groups=geometry, name="paged-prefix",
                        prefix_index=PAGED_PREFIX.hybrid_prefix_index(eviction))
    return batched, single


def _agree(a, b) -> None:
    a.check_integrity()
    b.check_integrity()
    assert np.array_equal(a.free_block_ids(), b.free_block_ids())
    assert a.prefix.index.evictable_block_ids().tolist() == b.prefix.index.evictable_block_ids().tolist()
    assert a.prefix_evicted_blocks == b.prefix_evicted_blocks and a.prefix.cached_blocks == b.prefix.cached_blocks
    assert a.snapshot() == b.snapshot()
    live = sorted(a.seqs.ids())
    for group in range(len(a.groups)):
        if live:
            da, db = a.describe_group(group, live), b.describe_group(group, live)
            assert np.array_equal(da.kv_indices, db.kv_indices) and np.array_equal(da.kv_indptr, db.kv_indptr)


def hybrid_eviction_walk(geometry, eviction: str, block_size: int, seed: int, num_ops: int) -> None:
    rng = np.random.default_rng(seed)
    units = sum(u for _, u in geometry)
    pools = _pools(geometry, eviction, block_size, capacity_slots=int(rng.integers(4, 9)) * MAX_LEN * units // 2)
    heads = [rng.integers(0, 40, MAX_LEN) for _ in range(3)]
    tokens: dict[int, list[int]] = {}
    final: dict[int, int] = {}
    seen: list[list[int]] = []
    next_id = 0
    for _ in range(num_ops):
        op = rng.choice(["admit", "admit", "append", "append", "append", "fork", "free"])
        ready = [i for i in tokens if len(tokens[i]) < final[i]]
        if op == "admit":
            if seen and rng.random() < 0.5:
                base = seen[int(rng.integers(len(seen)))]
                prompt = base[:int(rng.integers(1, len(base) + 1))] + rng.integers(0, 40, 4).tolist()
            else:
                prompt = heads[int(rng.integers(3))][:int(rng.integers(0, 50))].tolist() + \
                    rng.integers(0, 40, int(rng.integers(1, 20))).tolist()
            prompt = np.array(prompt[:MAX_LEN // 2], dtype=np.int32)
            spec = SeqSpec(prompt, int(rng.integers(prompt.shape[0], MAX_LEN + 1)))
            results = [p.admit([next_id], spec) for p in pools]
            assert results[0] == results[1]
            if results[0].admitted:
                tokens[next_id], final[next_id] = prompt.tolist(), spec.final_len
                next_id += 1
        elif op == "append" and ready:
            batch = [i for i in ready if rng.random() < 0.8] or ready[:1]
            if pools[0].can_append(batch):
                new = rng.integers(0, 40, len(batch)).astype(np.int32)
                results = [p.append(batch, new) for p in pools]
                assert np.array_equal(results[0].group_slots, results[1].group_slots)
                assert np.array_equal(results[0].copies, results[1].copies)
                for i, t in zip(batch, new.tolist(), strict=True):
                    tokens[i].append(t)
            else:
                assert not pools[1].can_append(batch)
                seen.append(tokens.pop(batch[-1]))
                for p in pools:
                    p.free(batch[-1])
        elif op == "fork" and ready:
            parent = ready[int(rng.integers(len(ready)))]
            for p in pools:
                p.fork(parent, next_id)
            tokens[next_id], final[next_id] = list(tokens[parent]), final[parent]
            next_id += 1
        elif op == "free" and tokens:
            seq_id = list(tokens)[int(rng.integers(len(tokens)))]
            seen.append(tokens.pop(seq_id))
            for p in pools:
                p.free(seq_id)
        _agree(*pools)
    assert pools[0].prefix_evicted_blocks > 0 or num_ops < 100, "the walk never evicted: the pool is too large"


# The quick run walks once per geometry and policy at block size 4, and with `lru` at block size 1 (many more
# blocks a walk, each evicted alone) on the geometry of three groups, window and full ones among them; the full
# run walks every geometry at both sizes with every policy three more times
QUICK_CASES = ([(geometry, 4, eviction) for eviction in POLICIES for geometry in GEOMETRIES]
               + [(GEOMETRIES[-1], 1, "lru")])


@pytest.mark.parametrize(("geometry", "block_size", "eviction"), QUICK_CASES)
@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_batched_eviction_matches_one_entry_at_a_time(geometry, eviction, block_size, seed):
    hybrid_eviction_walk(geometry, eviction, block_size, seed, num_ops=150)


@pytest.mark.slow
@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("eviction", list(POLICIES))
@pytest.mark.parametrize("block_size", [1, 4])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_more_batched_evictions_match_one_entry_at_a_time(geometry, eviction, block_size, seed):
    hybrid_eviction_walk(geometry, eviction, block_size, seed, num_ops=150)
