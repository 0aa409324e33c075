"""`paged-prefix`: hits, the last-token rule, LRU eviction order (tail first), counters, hashing."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from workbench.allocators import registry
from workbench.allocators.base import SeqSpec
from workbench.allocators.prefix_hash import block_keys
from workbench.workload.request import mix64


def prefix(capacity_blocks=16, block_size=4):
    return registry.create("paged-prefix", capacity_slots=capacity_blocks * block_size, block_size=block_size,
                           max_model_len=1000)


def tokens(n, start=0):
    return np.arange(start, start + n, dtype=np.int32)


def test_a_freed_prompt_is_cached_and_reused_by_the_next_identical_prefix():
    s = prefix()
    assert s.admit([1], SeqSpec(tokens(10), 20)).cached_tokens == 0  # blocks 0, 1 full; block 2 partial
    s.free(1)
    snap = s.snapshot()
    assert snap.cached_slots == 8 and snap.free_slots == 56 and snap.token_slots == 0
    assert sorted(s.cached_block_ids().tolist()) == [0, 1]
    assert s.admit([2], SeqSpec(np.concatenate([tokens(8), tokens(5, 100)]), 20)).cached_tokens == 8
    assert s.describe([2]).kv_indices.tolist() == [0, 1, 2, 3]
    assert (s.prefix_query_tokens, s.prefix_hit_tokens) == (23, 8)
    assert s.snapshot().cached_slots == 0
    s.check_integrity()


def test_a_hit_on_a_running_sequence_shares_its_blocks():
    s = prefix()
    s.admit([1], SeqSpec(tokens(9), 20))
    assert s.admit([2], SeqSpec(tokens(9), 20)).cached_tokens == 8
    assert s.describe([1, 2]).kv_indices.tolist() == [0, 1, 2, 0, 1, 3]
    assert s.snapshot().token_slots == 9 + 1


def test_a_fully_cached_prompt_still_recomputes_its_last_token():
    s = prefix()
    s.admit([1], SeqSpec(tokens(8), 20))  # two full blocks, both registered
    s.free(1)
    result = s.admit([2], SeqSpec(tokens(8), 20))
    assert result.cached_tokens == 4  # the last block is recomputed, so the last token has logits
    assert s.describe([2]).kv_indices.tolist() == [0, 2]  # block 1 stays cached, its key registered
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


def test_refused_admission_leaves_cache_and_counters_alone():
    s = prefix(capacity_blocks=4)
    s.admit([1], SeqSpec(tokens(8), 20))
    s.free(1)
    result = s.admit([2], SeqSpec(tokens(30), 40))
    assert not result.admitted
    assert (s.prefix_query_tokens, s.prefix_hit_tokens) == (8, 0)
    assert s.cached_block_ids().tolist() == [1, 0]


def test_counters_are_per_instance():
    first = prefix()
    first.admit([1], SeqSpec(tokens(9), 20))
    assert prefix().prefix_query_tokens == 0


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
        expected.append(int(mix64(np.array([chain], dtype=np.uint64))[0]))
    assert keys.tolist() == expected


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
    code = ("import numpy as np; from workbench.allocators.prefix_hash import block_keys;"
            "print(block_keys(np.arange(100, dtype=np.int32) * 7, 16).tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123"})
    assert out.stdout.strip() == str(block_keys(np.arange(100, dtype=np.int32) * 7, 16).tolist())


@pytest.mark.parametrize("block_size", [1, 3, 16, 256])
def test_no_full_block_means_no_key(block_size):
    assert block_keys(np.arange(block_size - 1, dtype=np.int32), block_size).shape == (0,)


def test_requests_sharing_a_system_prompt_hit_on_its_full_blocks():
    from workbench.workload.request import Request, Segment

    system = Segment(key=42, length=50)
    a = Request(0, 0.0, 70, 5, (system, Segment(1, 20)))
    b = Request(1, 0.0, 60, 5, (system, Segment(2, 10)))
    s = prefix(capacity_blocks=64, block_size=16)
    assert s.admit([0], SeqSpec(a.prompt_token_ids(), 75)).cached_tokens == 0
    assert s.admit([1], SeqSpec(b.prompt_token_ids(), 65)).cached_tokens == 48  # 3 full blocks of the 50
    assert (s.prefix_query_tokens, s.prefix_hit_tokens) == (130, 48)
    assert s.snapshot().token_slots == 70 + 60 - 48
