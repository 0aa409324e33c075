"""Prefix caching: hits, the last-token rule, counters and decode-filled blocks for every strategy that
declares a prefix cache; `paged-prefix`'s exact LRU eviction order (tail first) and its hashing."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.allocators.alloc_model import PoolModel
from workbench.allocators import registry
from workbench.allocators.prefix.keys import CHAIN_BASE, block_keys, chain_keys, position_salt
from workbench.allocators.prefix.loops import append_terms, start_rows
from workbench.allocators.values import SeqSpec
from workbench.splitmix import mix64

PREFIX_STRATEGIES = [reg.name for reg in registry.registrations() if reg.prefix_cache]
every_prefix_strategy = pytest.mark.parametrize("name", PREFIX_STRATEGIES)


def prefix(capacity_blocks=16, block_size=4, name="paged-prefix"):
    return registry.create(name, capacity_slots=capacity_blocks * block_size, block_size=block_size,
                           max_model_len=1000)


def tokens(n, start=0):
    return np.arange(start, start + n, dtype=np.int32)


@every_prefix_strategy
def test_a_freed_prompt_is_cached_and_reused_by_the_next_identical_prefix(name):
    s = prefix(name=name)
    assert s.admit([1], SeqSpec(tokens(10), 20)).cached_tokens == 0  # two full blocks, one partial
    full = s.describe([1]).kv_indices[:2].tolist()
    s.free(1)
    snap = s.snapshot()
    assert snap.cached_slots == 8 and snap.free_slots == 56 and snap.token_slots == 0
    assert sorted(s.cached_block_ids().tolist()) == sorted(full)
    assert sorted(s.prefix.evictable_block_set().tolist()) == sorted(full)  # what the integrity check counts
    prompt = np.concatenate([tokens(8), tokens(5, 100)])
    assert s.cached_prompt_tokens(prompt) == 8 and s.cached_prompt_tokens(tokens(5, 100)) == 0  # what a router reads
    assert s.admit([2], SeqSpec(prompt, 20)).cached_tokens == 8
    assert s.describe([2]).kv_indices.tolist()[:2] == full
    assert (s.prefix_query_tokens, s.prefix_hit_tokens) == (23, 8)
    assert s.snapshot().cached_slots == 0
    s.check_integrity()


@every_prefix_strategy
def test_a_hit_on_a_running_sequence_shares_its_blocks(name):
    s = prefix(name=name)
    s.admit([1], SeqSpec(tokens(9), 20))
    assert s.admit([2], SeqSpec(tokens(9), 20)).cached_tokens == 8
    first, second = s.describe([1]).kv_indices.tolist(), s.describe([2]).kv_indices.tolist()
    assert second[:2] == first[:2] and second[2] != first[2]
    assert s.snapshot().token_slots == 9 + 1


@every_prefix_strategy
def test_a_fully_cached_prompt_still_recomputes_its_last_token(name):
    s = prefix(name=name)
    s.admit([1], SeqSpec(tokens(8), 20))  # two full blocks, both registered
    held = s.describe([1]).kv_indices.tolist()
    s.free(1)
    result = s.admit([2], SeqSpec(tokens(8), 20))
    assert result.cached_tokens == 4  # the last block is recomputed, so the last token has logits
    again = s.describe([2]).kv_indices.tolist()
    assert again[0] == held[0] and again[1] != held[1]  # held[1] stays cached, its key registered
    assert s.snapshot().cached_slots == 4
    s.check_integrity()


def test_eviction_takes_free_blocks_first_then_least_recent_with_a_request_tail_first():
    s = prefix(capacity_blocks=8)
    s.admit([1], SeqSpec(tokens(13), 20))  # A: blocks 0, 1, 2 full and registered, block 3 partial
    s.admit([2], SeqSpec(tokens(9, 500), 20))  # C: blocks 4, 5 registered, 6 partial
    s.free(1)  # LRU: 2, 1, 0 (A's tail first); block 3 goes to the free stack
    s.free(2)  # LRU: 2, 1, 0, 5, 4
    assert s.cached_block_ids().tolist() == [2, 1, 0, 5, 4]
    s.admit([3], SeqSpec(tokens(20, 900), 20))  # 5 blocks: free 6, 3, 7, then evicts 2 and 1
    assert s.describe([3]).kv_indices.tolist() == [6, 3, 7, 2, 1]
    assert s.cached_block_ids().tolist() == [0, 5, 4]
    s.free(3)
    assert s.admit([4], SeqSpec(tokens(13), 20)).cached_tokens == 4  # only A's head block survived
    s.check_integrity()


@every_prefix_strategy
def test_refused_admission_leaves_cache_and_counters_alone(name):
    s = prefix(capacity_blocks=4, name=name)
    s.admit([1], SeqSpec(tokens(8), 20))
    s.free(1)
    result = s.admit([2], SeqSpec(tokens(30), 40))
    assert not result.admitted
    assert (s.prefix_query_tokens, s.prefix_hit_tokens) == (8, 0)
    assert s.cached_block_ids().shape == (2,)


@every_prefix_strategy
def test_counters_are_per_instance(name):
    first = prefix(name=name)
    first.admit([1], SeqSpec(tokens(9), 20))
    assert prefix(name=name).prefix_query_tokens == 0


def test_block_keys_are_the_sequential_chain():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50_000, 10 * 16 + 5).astype(np.int32)
    keys = block_keys(ids, 16)
    salt = mix64(np.arange(16, dtype=np.uint64))
    base = 0x9E3779B97F4A7C15 | 1
    chain = 0
    expected = []
    for i in range(10):
        with np.errstate(over="ignore"):
            content = int(mix64(np.array([mix64(ids[i * 16:(i + 1) * 16].astype(np.uint64) ^ salt).sum(
                dtype=np.uint64)]))[0])
        chain = (chain * base + content) % 2**64
        expected.append(chain)
    assert keys.tolist() == expected


@pytest.mark.parametrize("block_size", [1, 3, 16, 256])
def test_block_keys_equal_the_unrolled_chain_of_the_blocks_term_sums(block_size):
    # the prompt's compiled pass and `chain_keys` (a chunk after a known key) are two forms of one chain
    ids = np.random.default_rng(block_size).integers(0, 2**31 - 1, 41 * block_size - 1).astype(np.int32)
    full = ids[:40 * block_size].reshape(40, block_size)
    sums = mix64(full.astype(np.uint64) ^ position_salt(block_size)).sum(axis=1, dtype=np.uint64)
    assert block_keys(ids, block_size).tolist() == chain_keys(np.uint64(0), sums).tolist()
    keys = block_keys(ids, block_size)
    assert chain_keys(keys[9], sums[10:]).tolist() == keys[10:].tolist()


def test_block_keys_grown_token_by_token_equal_block_keys():
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 50_000, 7 * 16 + 9).astype(np.int32)
    rows, lengths = np.array([0]), np.zeros(1, dtype=np.int64)  # one sequence in row 0
    chain_key, term_sum = np.zeros(1, np.uint64), np.zeros(1, np.uint64)
    filled_rows, filled_parents, filled_keys = np.zeros(1, np.int64), np.zeros(1, np.uint64), np.zeros(1, np.uint64)
    grown, parents = [], []
    for token in ids.tolist():
        lengths[0] += 1
        if append_terms(rows, lengths, np.array([token], np.int32), position_salt(16), CHAIN_BASE, chain_key,
                        term_sum, np.ones(1, bool), filled_rows, filled_parents, filled_keys):
            grown.append(int(filled_keys[0]))
            parents.append(int(filled_parents[0]))
    assert grown == block_keys(ids, 16).tolist()
    assert parents == [0] + grown[:-1]  # each filled block's parent is the block before it
    # a sequence admitted with these tokens starts where the token-by-token growth ended
    started_key, started_sum, known = np.zeros(2, np.uint64), np.zeros(2, np.uint64), np.zeros(2, bool)
    start_rows(np.array([1]), ids, position_salt(16), block_keys(ids, 16)[-1], started_key, started_sum, known)
    assert started_key[1] == chain_key[0] and started_sum[1] == term_sum[0] and known.tolist() == [False, True]
    # a row whose tokens are not all known keeps its chain but reports no filled block
    lengths[0], unknown_key, unknown_sum = 0, np.zeros(1, np.uint64), np.zeros(1, np.uint64)
    for token in ids.tolist():
        lengths[0] += 1
        assert not append_terms(rows, lengths, np.array([token], np.int32), position_salt(16), CHAIN_BASE,
                                unknown_key, unknown_sum, np.zeros(1, bool), filled_rows, filled_parents, filled_keys)
    assert unknown_key[0] == chain_key[0] and unknown_sum[0] == term_sum[0]


def test_block_keys_depend_on_the_whole_prefix_and_the_position_inside_a_block():
    ids = np.arange(64, dtype=np.int32)
    keys = block_keys(ids, 16)
    changed = ids.copy()
    changed[5] += 1
    other = block_keys(changed, 16)
    assert np.all(keys != other)  # one token of block 0 changes every later key
    swapped = ids.copy()
    swapped[[20, 21]] = swapped[[21, 20]]
    assert block_keys(swapped, 16)[0] == keys[0] and np.all(block_keys(swapped, 16)[1:] != keys[1:])


def test_block_keys_are_identical_in_another_process():
    code = ("import numpy as np; from workbench.allocators.prefix.keys import block_keys;"
            "print(block_keys(np.arange(100, dtype=np.int32) * 7, 16).tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123"})
    assert out.stdout.strip() == str(block_keys(np.arange(100, dtype=np.int32) * 7, 16).tolist())


@pytest.mark.parametrize("block_size", [1, 3, 16, 256])
def test_no_full_block_means_no_key(block_size):
    assert block_keys(np.arange(block_size - 1, dtype=np.int32), block_size).shape == (0,)


@every_prefix_strategy
def test_requests_sharing_a_system_prompt_hit_on_its_full_blocks(name):
    from workbench.workload.request import Request, Segment

    system = Segment(key=42, length=50)
    a = Request(0, 0.0, 70, 5, (system, Segment(1, 20)))
    b = Request(1, 0.0, 60, 5, (system, Segment(2, 10)))
    s = prefix(capacity_blocks=64, block_size=16, name=name)
    assert s.admit([0], SeqSpec(a.prompt_token_ids(), 75)).cached_tokens == 0
    assert s.admit([1], SeqSpec(b.prompt_token_ids(), 65)).cached_tokens == 48  # 3 full blocks of the 50
    assert (s.prefix_query_tokens, s.prefix_hit_tokens) == (130, 48)
    assert s.snapshot().token_slots == 70 + 60 - 48


def _decode(model: PoolModel, seq_ids: list[int], tokens: np.ndarray) -> None:
    """Append tokens [num_steps, len(seq_ids)] step by step, checking the pool after each step."""
    for step_tokens in tokens:
        model.append_tokens(seq_ids, step_tokens.astype(np.int32))
        model.s.check_integrity()
        model.verify()


@every_prefix_strategy
def test_a_block_filled_during_decode_is_hit_by_a_prompt_holding_its_tokens(name):
    model = PoolModel(prefix(name=name))  # blocks of 4
    model.admit([1], tokens(6), 20)  # block 0 full (registered), block 1 holds 2 prompt tokens
    _decode(model, [1], tokens(7, 100)[:, None])  # fills block 1 (2 prompt + 2 generated) and block 2
    held = model.s.describe([1]).kv_indices.tolist()
    assert sorted(model.s.registered_block_ids().tolist()) == sorted(held[:3])
    answer = model.tokens[1]
    model.free(1)
    next_turn = np.array(answer + [500, 501], dtype=np.int32)  # 15 tokens: 3 full blocks cached
    assert model.admit([2], next_turn, 20).cached_tokens == 12  # the admit checks the hit blocks' tokens
    assert model.s.describe([2]).kv_indices.tolist()[:3] == held[:3]
    other = next_turn.copy()
    other[9] += 1  # a different generated token in block 2: the hit stops before it
    assert model.admit([3], other, 20).cached_tokens == 8
    assert (model.s.prefix_query_tokens, model.s.prefix_hit_tokens) == (6 + 15 + 15, 12 + 8)
    model.s.check_integrity()


@every_prefix_strategy
def test_parallel_samples_and_forks_register_only_their_own_tokens(name):
    model = PoolModel(prefix(capacity_blocks=32, name=name))
    model.admit([1, 2], tokens(6), 30)  # two samples share the prompt's blocks, block 1 half full
    _decode(model, [1, 2], np.array([[100, 200], [101, 201]]))  # each fills its own copy of block 1
    model.fork(2, 3)  # the child shares sample 2's blocks and continues its chain
    _decode(model, [1, 2, 3], np.array([[102, 202, 302], [103, 203, 303], [104, 204, 304], [105, 205, 305]]))
    answers = {i: list(model.tokens[i]) for i in (1, 2, 3)}
    for i in (1, 2, 3):
        model.free(i)
    for new_id, i in enumerate((1, 2, 3), start=10):
        prompt = np.array(answers[i] + [999], dtype=np.int32)  # 13 tokens
        assert model.admit([new_id], prompt, 30).cached_tokens == 12, f"sample {i}"
    model.s.check_integrity()


@every_prefix_strategy
def test_appending_without_token_ids_registers_nothing_more(name):
    s = prefix(name=name)
    s.admit([1], SeqSpec(tokens(6), 20))
    for _ in range(6):
        s.append([1])
    s.free(1)
    assert s.admit([2], SeqSpec(np.concatenate([tokens(6), tokens(6, 100), tokens(1, 500)]), 20)).cached_tokens == 4
    s.check_integrity()


def test_lru_policy_evicts_in_insertion_order_and_touch_moves_to_the_back():
    from workbench.allocators.prefix.eviction import LRUPolicy

    policy = LRUPolicy()
    for block in (5, 3, 8, 1):
        policy.add(block)
    policy.touch(3)
    policy.remove(8)
    policy.remove(42)  # not evictable: nothing happens
    assert policy.ids().tolist() == [5, 1, 3] and len(policy) == 3
    assert [policy.pop_victim() for _ in range(3)] == [5, 1, 3]
    with pytest.raises(KeyError):
        policy.pop_victim()


def test_hash_index_registers_copies_of_a_key_and_returns_the_earliest():
    # vLLM v1's BlockHashToBlockMap: no de-duplication; get_one_block returns the first block still
    # registered under the hash; evicting a block pops that block id only
    from workbench.allocators.prefix.hash_index import HashPrefixIndex

    index = HashPrefixIndex()
    keys = np.array([11, 22, 33], dtype=np.uint64)
    index.insert(np.array([0, 11, 22], dtype=np.uint64), keys, np.array([4, 5, 6], dtype=np.int32),
                 np.array([-1, 4, 5], dtype=np.int32))
    index.insert(np.array([11], dtype=np.uint64), keys[1:2], np.array([9], dtype=np.int32),
                 np.array([4], dtype=np.int32))  # a copy of 22
    assert index.lookup(keys, 3).tolist() == [4, 5, 6] and index.lookup(keys, 2).tolist() == [4, 5]
    assert index.release(np.array([4, 9, 5], dtype=np.int32)).tolist() == []  # the copy 9 is registered
    assert index.evictable_block_ids().tolist() == [5, 9, 4]  # tail first
    index.claim(np.array([4], dtype=np.int32))
    assert index.evict(1).tolist() == [5]
    assert index.lookup(keys, 3).tolist() == [4, 9, 6]  # 22 lives on in its copy 9
    assert index.evict(1).tolist() == [9]
    assert index.lookup(keys, 3).tolist() == [4]  # 22 is gone, so the run stops there
    assert sorted(index.registered_block_ids().tolist()) == [4, 6]
    with pytest.raises(RuntimeError):
        index.evict(1)


def test_a_recomputed_last_block_is_registered_and_keeps_its_hit_after_the_original_is_evicted():
    # vLLM v1 registers the recomputed copy of a fully cached prompt's last block under the same hash
    # (block_pool.cache_full_blocks does not de-duplicate): once the original is evicted, the copy
    # still serves the hit. Block ids by hand: 6 blocks of 4 slots, the free stack hands out 0, 1, ...
    s = prefix(capacity_blocks=6)
    s.admit([1], SeqSpec(tokens(8), 20))  # blocks 0, 1 (keys K0, K1)
    s.free(1)  # LRU: 1, 0
    s.admit([2], SeqSpec(tokens(8), 20))  # hits 0; its last block is recomputed into 2, registered as K1
    assert s.describe([2]).kv_indices.tolist() == [0, 2]
    assert sorted(s.registered_block_ids().tolist()) == [0, 1, 2]
    s.admit([3], SeqSpec(tokens(16, 500), 20))  # free 3, 4, 5, then evicts 1, the original K1
    assert s.describe([3]).kv_indices.tolist() == [3, 4, 5, 1]
    s.free(2)  # 2 (K1's copy) and 0 become cached, tail first
    s.free(3)
    assert s.cached_block_ids().tolist() == [2, 0, 1, 5, 4, 3]
    assert s.admit([4], SeqSpec(tokens(9), 20)).cached_tokens == 8  # K0 and K1 hit: 0 and the copy 2
    assert s.describe([4]).kv_indices.tolist() == [0, 2, 1]
    s.check_integrity()
