"""Numba cache_write, block_copy and block_swap against NumPy, in randomized walks."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench import kernels
from workbench.kernels import reference as ref

DTYPES = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}


def _random_pool(rng, num_slots, kv_dtype):
    values = rng.standard_normal((num_slots, 2, 8)).astype(np.float32)  # [num_slots, num_kv_heads, head_dim]
    return values.view(np.uint16)[..., ::2].copy() if kv_dtype == "bf16" else values.astype(DTYPES[kv_dtype])


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), kv_dtype=st.sampled_from(list(DTYPES)), block_size=st.sampled_from([1, 4, 16]))
def test_walk_of_cache_ops_matches_numpy(seed, kv_dtype, block_size):
    """A random sequence of writes, copies and swaps leaves numba pools equal to the reference's, bit for bit."""
    rng = np.random.default_rng(seed)
    num_blocks = 12
    num_slots = num_blocks * block_size
    pools = [_random_pool(rng, num_slots, kv_dtype) for _ in range(2)]  # k, v
    host = [_random_pool(rng, 5 * block_size, kv_dtype) for _ in range(2)]  # a smaller swap space
    expected = [p.copy() for p in pools]
    expected_host = [h.copy() for h in host]
    for _ in range(8):
        op = rng.integers(3)
        if op == 0:
            num_tokens = int(rng.integers(0, 10))
            slots = rng.choice(num_slots, size=num_tokens, replace=False).astype(np.int64)
            slots[rng.random(num_tokens) < 0.3] = -1  # padding tokens: skipped
            new = [_random_pool(rng, num_tokens, kv_dtype) for _ in range(2)]
            kernels.cache_write(*pools, *new, slots)
            ref.cache_write(*expected, *new, slots)
        elif op == 1:
            blocks = rng.permutation(num_blocks)
            n = int(rng.integers(0, 5))
            copies = np.stack([blocks[:n], blocks[n : 2 * n]], axis=1).astype(np.int32)  # dst never a src
            kernels.block_copy(*pools, copies, block_size)
            ref.block_copy(*expected, copies, block_size)
        else:
            n = int(rng.integers(0, 5))
            if rng.integers(2):  # device → host: any sources, distinct destinations
                moves = np.stack([rng.choice(num_blocks, n), rng.choice(5, n, replace=False)], axis=1)
                kernels.block_swap(*pools, *host, moves.astype(np.int32), block_size)
                ref.block_swap(*expected, *expected_host, moves.astype(np.int32), block_size)
            else:
                moves = np.stack([rng.choice(5, n), rng.choice(num_blocks, n, replace=False)], axis=1)
                kernels.block_swap(*host, *pools, moves.astype(np.int32), block_size)
                ref.block_swap(*expected_host, *expected, moves.astype(np.int32), block_size)
        for got, want in zip(pools + host, expected + expected_host, strict=True):
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_cache_write_touches_only_mapped_slots():
    pool_k = np.full((8, 1, 4), 7.0, np.float32)
    pool_v = np.full((8, 1, 4), 9.0, np.float32)
    new = np.arange(12, dtype=np.float32).reshape(3, 1, 4)
    kernels.cache_write(pool_k, pool_v, new, -new, np.array([-1, 6, 2], np.int64))
    assert pool_k[6, 0].tolist() == [4, 5, 6, 7] and pool_k[2, 0].tolist() == [8, 9, 10, 11]
    assert pool_v[6, 0].tolist() == [-4, -5, -6, -7]
    untouched = np.delete(np.arange(8), [2, 6])
    assert (pool_k[untouched] == 7).all() and (pool_v[untouched] == 9).all()
