"""The CUDA kernels on a GPU through CuPy: the docs/kernels.md grid against the reference, and cupy against numba.

Marked `gpu`; skipped when CuPy is not installed or sees no device.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_cases import KV_DTYPES, TOLERANCE, assert_attention_close, fp8_write_rows, make_case, random_qo_indptr

from workbench import kernels
from workbench.kernels import reference as ref

cp = pytest.importorskip("cupy")
try:
    _gpu = bool(cp.cuda.is_available())
except Exception:  # a broken driver install means no GPU here
    _gpu = False
if not _gpu:
    pytest.skip("no CUDA device visible to CuPy", allow_module_level=True)

from workbench.kernels import cupy_backend  # noqa: E402  (imports cupy)

pytestmark = pytest.mark.gpu
GRID_LENGTHS = [1, 15, 16, 17, 97, 1000]


def _on_device(case):
    """The case's arrays as CuPy arrays (same field names)."""
    fields = ("q", "paged_k", "paged_v", "kv_indptr", "kv_indices", "kv_last_page_len", "contig_k", "contig_v",
              "kv_start", "kv_len")
    return {name: cp.asarray(getattr(case, name)) for name in fields}


def _reference(case, qo_indptr):
    return ref.paged_extend(case.q, qo_indptr, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                            case.kv_last_page_len, case.block_size, case.kv_dtype, 1 / np.sqrt(case.q.shape[2]))


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("block_size", [1, 2, 8, 16, 32, 128, 256])
def test_decode_grid(block_size, group, kv_dtype):
    rng = np.random.default_rng([block_size, group, len(kv_dtype), 21])
    case = make_case(rng, rng.permutation(GRID_LENGTHS), 2 * group, 2, 64, block_size, kv_dtype)
    d = _on_device(case)
    paged = kernels.paged_decode(d["q"], d["paged_k"], d["paged_v"], d["kv_indptr"], d["kv_indices"],
                                 d["kv_last_page_len"], block_size, backend="cupy", kv_dtype=kv_dtype)
    contig = kernels.contiguous_decode(d["q"], d["contig_k"], d["contig_v"], d["kv_start"], d["kv_len"],
                                       backend="cupy", kv_dtype=kv_dtype)
    assert isinstance(paged, cp.ndarray)
    indptr = np.arange(len(GRID_LENGTHS) + 1)
    assert_attention_close(cp.asnumpy(paged), _reference(case, indptr), kv_dtype, indptr)
    np.testing.assert_array_equal(cp.asnumpy(paged), cp.asnumpy(contig))


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_extend_grid(block_size, kv_dtype):
    rng = np.random.default_rng([block_size, len(kv_dtype), 22])
    lengths = rng.permutation(GRID_LENGTHS)
    qo_indptr = random_qo_indptr(rng, lengths)
    case = make_case(rng, lengths, 8, 2, 64, block_size, kv_dtype, num_q=int(qo_indptr[-1]))
    d = _on_device(case)
    paged = kernels.paged_extend(d["q"], cp.asarray(qo_indptr), d["paged_k"], d["paged_v"], d["kv_indptr"],
                                 d["kv_indices"], d["kv_last_page_len"], block_size, backend="cupy",
                                 kv_dtype=kv_dtype)
    assert_attention_close(cp.asnumpy(paged), _reference(case, qo_indptr), kv_dtype, qo_indptr)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
@pytest.mark.parametrize("partition_tokens", [None, 5, 300])
def test_head_dims_and_split_k(head_dim, kv_dtype, partition_tokens):
    rng = np.random.default_rng([head_dim, len(kv_dtype), 23])
    qo_indptr = np.array([0, 1, 4, 9, 10], dtype=np.int32)
    case = make_case(rng, [1, 17, 97, 1000], 8, 2, head_dim, 16, kv_dtype, num_q=10)
    d = _on_device(case)
    paged = (d["kv_indptr"], d["kv_indices"], d["kv_last_page_len"], 16)
    out = cupy_backend.attention(d["q"], cp.asarray(qo_indptr), d["paged_k"], d["paged_v"], kv_dtype,
                                 1 / np.sqrt(head_dim), paged=paged, partition_tokens=partition_tokens)
    assert_attention_close(cp.asnumpy(out), _reference(case, qo_indptr), kv_dtype, qo_indptr)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("context", [1024, 8192])
def test_cupy_agrees_with_numba_at_serving_shapes(context, kv_dtype):
    """docs/performance.md shape (32 q / 8 kv heads, head_dim 128, block 16) with the launcher's own split-K choice."""
    rng = np.random.default_rng([context, len(kv_dtype), 24])
    lengths = rng.integers(context // 2, context + 1, size=4)
    case = make_case(rng, lengths, 32, 8, 128, 16, kv_dtype)
    d = _on_device(case)
    gpu = kernels.paged_decode(d["q"], d["paged_k"], d["paged_v"], d["kv_indptr"], d["kv_indices"],
                               d["kv_last_page_len"], 16, backend="cupy", kv_dtype=kv_dtype)
    cpu = kernels.paged_decode(case.q, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                               case.kv_last_page_len, 16, backend="numba", kv_dtype=kv_dtype)
    assert ref.rel_err(cp.asnumpy(gpu), cpu) <= TOLERANCE[kv_dtype]


@pytest.mark.parametrize("source", ["fp16", "bf16", "fp32"])
def test_fp8_quantizing_write_matches_the_reference_quantizer(source):
    """write_cache_fp8 on the device (flush-to-zero, the GPU's own division) stores the reference quantizer's
    codes for every fp16 / bf16 bit pattern and a float32 sample, with non-trivial per-tensor scales."""
    rng = np.random.default_rng([len(source), 26])
    rows = fp8_write_rows(source, rng)  # [T, 2, 64] model-dtype rows
    slots = rng.permutation(rows.shape[0] + 8)[: rows.shape[0]].astype(np.int64)
    slots[::7] = -1
    k_pool = cp.full((rows.shape[0] + 8, 2, 64), 0x55, dtype=cp.uint8)
    v_pool = k_pool.copy()
    kernels.cache_write(k_pool, v_pool, cp.asarray(rows), cp.asarray(rows), cp.asarray(slots), backend="cupy",
                        k_scale=0.37, v_scale=2.0**-20)
    expected_k, expected_v = np.full(k_pool.shape, 0x55, np.uint8), np.full(v_pool.shape, 0x55, np.uint8)
    ref.cache_write_fp8(expected_k, expected_v, rows, rows, slots, source, (0.37, 2.0**-20))
    np.testing.assert_array_equal(cp.asnumpy(k_pool), expected_k)
    np.testing.assert_array_equal(cp.asnumpy(v_pool), expected_v)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_cache_ops_match_numpy_including_host_swap(kv_dtype):
    rng = np.random.default_rng([len(kv_dtype), 25])
    block_size, num_blocks, host_blocks = 16, 12, 6
    storage = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16, "fp8": np.uint8}[kv_dtype]

    def rows(n):
        return rng.integers(0, 1 << 14, size=(n, 2, 64)).astype(storage)

    k, v = rows(num_blocks * block_size), rows(num_blocks * block_size)
    host_k, host_v = rows(host_blocks * block_size), rows(host_blocks * block_size)
    dk, dv = cp.asarray(k), cp.asarray(v)
    slots = rng.choice(num_blocks * block_size, size=20, replace=False).astype(np.int64)
    slots[::4] = -1
    new_k, new_v = rows(20), rows(20)
    kernels.cache_write(dk, dv, cp.asarray(new_k), cp.asarray(new_v), cp.asarray(slots), backend="cupy")
    ref.cache_write(k, v, new_k, new_v, slots)
    copies = np.array([[0, 5], [3, 7], [3, 8]], dtype=np.int32)
    kernels.block_copy(dk, dv, cp.asarray(copies), block_size, backend="cupy")
    ref.block_copy(k, v, copies, block_size)
    expected_host_k, expected_host_v = host_k.copy(), host_v.copy()
    out_moves = np.array([[1, 4], [9, 0]], dtype=np.int32)  # device -> host
    kernels.block_swap(dk, dv, host_k, host_v, out_moves, block_size, backend="cupy")
    ref.block_swap(k, v, expected_host_k, expected_host_v, out_moves, block_size)
    in_moves = np.array([[2, 10], [4, 11]], dtype=np.int32)  # host -> device
    kernels.block_swap(host_k, host_v, dk, dv, in_moves, block_size, backend="cupy")
    ref.block_swap(expected_host_k, expected_host_v, k, v, in_moves, block_size)
    np.testing.assert_array_equal(cp.asnumpy(dk), k)
    np.testing.assert_array_equal(cp.asnumpy(dv), v)
    np.testing.assert_array_equal(host_k, expected_host_k)
    np.testing.assert_array_equal(host_v, expected_host_v)


def test_repeated_calls_are_bit_identical():
    rng = np.random.default_rng(26)
    case = make_case(rng, [8192, 17, 3000], 32, 8, 128, 16, "fp16")
    d = _on_device(case)
    args = (d["q"], d["paged_k"], d["paged_v"], d["kv_indptr"], d["kv_indices"], d["kv_last_page_len"], 16)
    first = cp.asnumpy(kernels.paged_decode(*args, backend="cupy", kv_dtype="fp16"))
    for _ in range(3):
        np.testing.assert_array_equal(cp.asnumpy(kernels.paged_decode(*args, backend="cupy", kv_dtype="fp16")), first)


@pytest.mark.parametrize("partition_tokens", [None, 64, 300])
def test_group_8_head_dim_128_split_k(partition_tokens):
    """16 query / 2 kv heads (8 rows per block over two row warps), head_dim 128, fp16, planned or forced split-K."""
    rng = np.random.default_rng([partition_tokens or 0, 27])
    lengths = [1, 300, 1000, 65, 8192]
    case = make_case(rng, lengths, 16, 2, 128, 16, "fp16")
    d = _on_device(case)
    indptr = np.arange(len(lengths) + 1, dtype=np.int32)
    out = cupy_backend.attention(d["q"], cp.asarray(indptr), d["paged_k"], d["paged_v"], "fp16", 128**-0.5,
                                 paged=(d["kv_indptr"], d["kv_indices"], d["kv_last_page_len"], 16),
                                 partition_tokens=partition_tokens)
    assert_attention_close(cp.asnumpy(out), _reference(case, indptr), "fp16", indptr)


def test_misaligned_pool_is_refused():
    rng = np.random.default_rng(28)
    case = make_case(rng, [5], 2, 2, 64, 4, "fp16")
    d = _on_device(case)
    storage = cp.empty(case.paged_k.size + 8, dtype=cp.float16)
    shifted_k = storage[1 : 1 + case.paged_k.size].reshape(case.paged_k.shape)  # 2 bytes past a 16-byte boundary
    shifted_k[...] = d["paged_k"]
    with pytest.raises(ValueError, match="16-byte boundary"):
        kernels.paged_decode(d["q"], shifted_k, d["paged_v"], d["kv_indptr"], d["kv_indices"],
                             d["kv_last_page_len"], 4, backend="cupy", kv_dtype="fp16")


def test_pool_past_2_pow_31_elements():
    """fp16 pools of 2^31 + 2^20 elements (4 GiB each): a sequence whose blocks sit past element 2^31 reads
    the right rows, so every index product is 64-bit. The reference sees the used slots copied to the host."""
    head_dim, num_kv_heads, block_size, context = 128, 1, 16, 1000
    num_slots = (2**31 + 2**20) // (num_kv_heads * head_dim)
    num_blocks = num_slots // block_size
    rng = np.random.default_rng(29)
    nblocks = -(-context // block_size)
    blocks = np.sort(rng.choice(np.arange(num_blocks - 4 * nblocks, num_blocks), nblocks, replace=False))
    blocks = rng.permutation(blocks).astype(np.int32)
    assert int(blocks.min()) * block_size * head_dim > 2**31
    k_pool = cp.zeros((num_slots, num_kv_heads, head_dim), dtype=cp.float16)
    v_pool = cp.zeros_like(k_pool)
    slots = (blocks[:, None].astype(np.int64) * block_size + np.arange(block_size)).reshape(-1)[:context]
    k_rows = rng.standard_normal((context, num_kv_heads, head_dim)).astype(np.float16)
    v_rows = rng.standard_normal((context, num_kv_heads, head_dim)).astype(np.float16)
    k_pool[cp.asarray(slots)] = cp.asarray(k_rows)
    v_pool[cp.asarray(slots)] = cp.asarray(v_rows)
    q = rng.standard_normal((1, 4, head_dim), dtype=np.float32)
    indptr = np.array([0, nblocks], dtype=np.int32)
    last = np.array([context - (nblocks - 1) * block_size], dtype=np.int32)
    out = kernels.paged_decode(cp.asarray(q), k_pool, v_pool, cp.asarray(indptr), cp.asarray(blocks),
                               cp.asarray(last), block_size, backend="cupy", kv_dtype="fp16")
    expected = ref.contiguous_decode(q, k_rows, v_rows, np.array([0], np.int32), np.array([context], np.int32),
                                     "fp16", head_dim**-0.5)
    assert ref.rel_err(cp.asnumpy(out), expected) <= TOLERANCE["fp16"]
    del k_pool, v_pool
    cp.get_default_memory_pool().free_all_blocks()
