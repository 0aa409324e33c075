"""The CUDA cache_write, copy_blocks kernels through the CPU shim against NumPy, bit for bit, in randomized walks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench import kernels
from workbench.kernels import cuda_cpu, launch
from workbench.kernels import reference as ref

try:
    cuda_cpu.shim_include_dir()
except cuda_cpu.ShimBuildError as exc:
    pytest.skip(str(exc), allow_module_level=True)

BACKEND = "cuda-cpu"
DTYPES = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}


def _random_rows(rng, num_rows, num_kv_heads, head_dim, kv_dtype):
    """Random rows in the storage dtype; every bit pattern distinct enough that a misplaced row shows."""
    bits = rng.integers(0, 1 << 16, size=(num_rows, num_kv_heads, head_dim), dtype=np.uint16)
    if kv_dtype == "fp32":
        return rng.standard_normal((num_rows, num_kv_heads, head_dim)).astype(np.float32)
    return bits.view(np.float16) if kv_dtype == "fp16" else bits


def _copy_pairs(rng, num_blocks, count):
    """(src, dst) pairs with distinct destinations, none of which is also a source."""
    chosen = rng.choice(num_blocks, size=2 * count, replace=False)
    return np.stack([chosen[:count], chosen[count:]], axis=1).astype(np.int32)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    kv_dtype=st.sampled_from(list(DTYPES)),
    block_size=st.sampled_from([1, 3, 16]),
    head_dim=st.sampled_from([5, 8, 64]),  # 5: rows of 10/20 bytes take the 2-byte word path
)
def test_walk_of_cache_ops_matches_numpy(seed, kv_dtype, block_size, head_dim):
    """Writes (with skipped padding slots), copy-on-write copies and swaps both ways match NumPy exactly."""
    rng = np.random.default_rng(seed)
    num_kv_heads, num_blocks, host_blocks = 2, 10, 6
    shape = (num_kv_heads, head_dim)
    pools = [_random_rows(rng, num_blocks * block_size, *shape, kv_dtype) for _ in range(2)]
    host = [_random_rows(rng, host_blocks * block_size, *shape, kv_dtype) for _ in range(2)]
    expected, expected_host = [p.copy() for p in pools], [h.copy() for h in host]
    for _ in range(6):
        op = rng.integers(4)
        if op == 0:
            num_tokens = int(rng.integers(0, min(12, num_blocks * block_size) + 1))
            slots = rng.choice(num_blocks * block_size, size=num_tokens, replace=False).astype(np.int64)
            slots[rng.random(num_tokens) < 0.3] = -1
            new = [_random_rows(rng, num_tokens, *shape, kv_dtype) for _ in range(2)]
            kernels.cache_write(*pools, *new, slots, backend=BACKEND)
            ref.cache_write(*expected, *new, slots)
        elif op == 1:
            copies = _copy_pairs(rng, num_blocks, int(rng.integers(0, 4)))
            kernels.block_copy(*pools, copies, block_size, backend=BACKEND)
            ref.block_copy(*expected, copies, block_size)
        elif op == 2:
            moves = np.stack([rng.choice(num_blocks, 3, replace=False), rng.choice(host_blocks, 3, replace=False)], 1)
            kernels.block_swap(*pools, *host, moves.astype(np.int32), block_size, backend=BACKEND)
            ref.block_swap(*expected, *expected_host, moves, block_size)
        else:
            moves = np.stack([rng.choice(host_blocks, 2, replace=False), rng.choice(num_blocks, 2, replace=False)], 1)
            kernels.block_swap(*host, *pools, moves.astype(np.int32), block_size, backend=BACKEND)
            ref.block_swap(*expected_host, *expected, moves, block_size)
        for got, want in zip(pools + host, expected + expected_host, strict=True):
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def test_copy_word_choice():
    """16-byte words only when the row and every pointer allow it; a 10-byte fp16 row falls back to 2 bytes."""
    assert launch.copy_word_bytes(64 * 2 * 2, 0x1000, 0x2000) == 16
    assert launch.copy_word_bytes(5 * 2 * 2, 0x1000, 0x2000) == 2
    assert launch.copy_word_bytes(64 * 2 * 2, 0x1000, 0x2008) == 2


def test_out_of_range_slot_is_rejected_before_any_write():
    rng = np.random.default_rng(3)
    pools = [_random_rows(rng, 8, 2, 8, "fp32") for _ in range(2)]
    before = [p.copy() for p in pools]
    new = [_random_rows(rng, 2, 2, 8, "fp32") for _ in range(2)]
    with pytest.raises(ValueError, match="outside the pool"):
        cuda_cpu.cache_write(*pools, *new, np.array([1, 8], dtype=np.int64))
    for got, want in zip(pools, before, strict=True):
        np.testing.assert_array_equal(got, want)
