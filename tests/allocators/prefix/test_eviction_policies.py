"""Each eviction policy against LRU on a hand-built stream where they pick different victims (block
ids written by hand), the policies' own ordering rules, and radix's leaf-only eviction.

Pools of 4-token blocks; the free stack hands out 0, 1, 2, ... first; a request's partial last block
goes back to the free stack when it is freed, its full blocks stay cached (released tail first)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.allocators import registry
from workbench.allocators.prefix.eviction import POLICIES, HeapPolicy, LRUPolicy, make_policy
from workbench.allocators.values import SeqSpec


def tokens(n, start=0):
    return np.arange(start, start + n, dtype=np.int32)


def strategy(name="paged-prefix", eviction="lru", capacity_blocks=6):
    return registry.create(name, capacity_slots=capacity_blocks * 4, block_size=4, max_model_len=1000,
                           eviction=eviction)


def test_every_policy_is_a_choice_of_the_eviction_option():
    assert tuple(POLICIES) == registry.option_choices("eviction")
    assert registry.option_default("eviction") == "lru"
    with pytest.raises(ValueError, match="unknown eviction"):
        make_policy("random")


@pytest.mark.parametrize(("eviction", "order"), [("lru", [1, 0]), ("fifo", [0, 1])])
def test_fifo_ignores_a_hit_that_lru_counts(eviction, order):
    s = strategy(eviction=eviction)
    s.admit([1], SeqSpec(tokens(5), 20))  # A: block 0 full (registered), 1 partial
    s.free(1)  # 0 cached (first use)
    s.admit([2], SeqSpec(tokens(5, 100), 20))  # B: block 1 full, 2 partial
    s.free(2)  # 1 cached
    s.admit([3], SeqSpec(tokens(5), 20))  # hits A's block 0 again (a second use)
    s.free(3)
    # LRU: B's block 1 was used longest ago; FIFO: A's block 0 came first and the hit does not help it
    assert s.cached_block_ids().tolist() == order


@pytest.mark.parametrize(("eviction", "order"), [("lru", [0, 1]), ("lfu", [1, 0])])
def test_lfu_keeps_a_block_used_twice_over_a_newer_one_used_once(eviction, order):
    s = strategy(eviction=eviction)
    s.admit([1], SeqSpec(tokens(5), 20))  # A: block 0
    s.free(1)
    s.admit([2], SeqSpec(tokens(5), 20))  # A again: block 0 hit (uses: release, hit, release)
    s.free(2)
    s.admit([3], SeqSpec(tokens(5, 100), 20))  # B: block 1, used once, after A
    s.free(3)
    assert s.cached_block_ids().tolist() == order


@pytest.mark.parametrize(("eviction", "order"), [("lru", [0, 2, 1]), ("depth", [2, 0, 1])])
def test_depth_evicts_the_deepest_block_before_an_older_shallow_one(eviction, order):
    s = strategy(eviction=eviction)
    s.admit([1], SeqSpec(tokens(5), 20))  # A: block 0 at depth 0
    s.free(1)
    s.admit([2], SeqSpec(tokens(9, 100), 20))  # B: blocks 1 (depth 0), 2 (depth 1), 3 partial
    s.free(2)  # released tail first: 2, then 1
    # LRU: A's block 0 first (oldest); depth: B's depth-1 block 2 first, then by recency 0 before 1
    assert s.cached_block_ids().tolist() == order


@pytest.mark.parametrize(("name", "eviction", "victim", "hit_tokens"), [
    ("paged-prefix", "lru", 1, 4), ("paged-prefix", "fifo", 0, 0), ("radix", "lru", 1, 4), ("radix", "fifo", 1, 4)])
def test_radix_evicts_leaves_only_where_a_flat_index_orphans_a_child(name, eviction, victim, hit_tokens):
    s = strategy(name, eviction, capacity_blocks=4)
    s.admit([1], SeqSpec(tokens(5), 20))  # H: block 0 registered first
    s.free(1)
    s.admit([2], SeqSpec(tokens(9), 20))  # hits H (block 0); C = block 1 registered under it; 2 partial
    s.free(2)
    s.admit([3], SeqSpec(tokens(9, 100), 20))  # 3 blocks: free 2, 3, then one eviction
    assert s.describe([3]).kv_indices.tolist() == [2, 3, victim]
    assert s.prefix_evicted_blocks == 1
    s.free(3)
    # FIFO in a flat index evicts H (first in) and leaves C unreachable: the next [H, C] prompt hits
    # nothing. The radix tree evicts only leaves: C goes, H stays and still hits.
    assert s.admit([4], SeqSpec(tokens(9), 20)).cached_tokens == hit_tokens
    s.check_integrity()


def test_radix_locks_a_running_path_and_counts_its_unlocked_ancestors_only_after_release():
    s = strategy("radix", capacity_blocks=8)
    s.admit([1], SeqSpec(tokens(12), 20))  # blocks 0, 1, 2 full: a path H -> M -> T
    s.admit([2], SeqSpec(tokens(13), 20))  # hits 0, 1, 2 (12 of 13 tokens), its own partial block 3
    s.free(1)
    assert s.num_allocatable_blocks() == 4  # the path is still locked by sequence 2: nothing cached
    s.free(2)
    assert s.cached_block_ids().tolist() == [2, 1, 0]  # leaves first: the tail, then its parents
    s.check_integrity()


class HeapLRU(HeapPolicy):
    """LRU on the shared heap: the reference order of `LRUPolicy`'s linked list."""

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[int, int] = {}

    def _use(self, block: int) -> None:
        self._last[block] = self._tick

    def _priority(self, block: int) -> tuple:
        return (self._last[block],)

    def _forget(self, block: int) -> None:
        del self._last[block]


@pytest.mark.parametrize("seed", range(20))
def test_lru_linked_list_keeps_the_heap_order_through_every_operation(seed):
    rng = np.random.default_rng(seed)
    fast, ref = LRUPolicy(), HeapLRU()
    registered: set[int] = set()  # blocks with statistics (used since they were last evicted)
    for _ in range(400):
        op = rng.choice(["add", "add_many", "touch", "remove", "restore", "pop", "pops", "claims"])
        outside = [b for b in registered if b not in ref]
        if op == "add":
            block = int(rng.integers(0, 60))
            if block not in ref:
                fast.add(block)
                ref.add(block)
                registered.add(block)
        elif op == "add_many":
            blocks = list(dict.fromkeys(b for b in rng.integers(0, 60, 5).tolist() if b not in ref))
            fast.add_many(np.array(blocks, dtype=np.int32))
            for block in blocks:
                ref.add(block)
            registered.update(blocks)
        elif op == "touch" and registered:
            block = sorted(registered)[int(rng.integers(len(registered)))]
            fast.touch(block)
            ref.touch(block)
        elif op == "remove":
            block = int(rng.integers(0, 60))
            fast.remove(block)
            ref.remove(block)
        elif op == "restore" and outside:
            block = sorted(outside)[int(rng.integers(len(outside)))]
            fast.restore(block)
            ref.restore(block)
        elif op == "pop" and len(ref):
            block = ref.pop_victim()
            assert fast.pop_victim() == block
            registered.discard(block)
        elif op == "pops" and len(ref):
            k = int(rng.integers(1, len(ref) + 1))
            victims = [ref.pop_victim() for _ in range(k)]
            assert fast.pop_victims(k).tolist() == victims
            registered.difference_update(victims)
        elif op == "claims" and registered:  # hits: each leaves the set (if in it) and is used
            blocks = list(dict.fromkeys(sorted(registered)[i] for i in rng.integers(0, len(registered), 3).tolist()))
            fast.claim_many(np.array(blocks, dtype=np.int32))
            ref.claim_many(np.array(blocks, dtype=np.int32))
        assert fast.ids().tolist() == ref.ids().tolist() and len(fast) == len(ref)
