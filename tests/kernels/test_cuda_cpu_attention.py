"""The CUDA attention kernel, run on the CPU through the fiber shim, against the float64 reference.

Pools are poisoned with NaN outside the sequences' slots and the backend's outputs start as NaN,
so a wrong slot, a missed row or an unwritten element fails `assert_attention_close`. Paged and
contiguous calls over the same logical KV run the same schedule and must agree bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_cases import KV_DTYPES, assert_attention_close, make_case, random_qo_indptr

from workbench import kernels
from workbench.kernels import cuda_cpu
from workbench.kernels import reference as ref

try:
    cuda_cpu.shim_include_dir()
except cuda_cpu.ShimBuildError as exc:
    pytest.skip(str(exc), allow_module_level=True)

GRID_LENGTHS = [1, 15, 16, 17, 97, 1000]
BACKEND = "cuda-cpu"


def _decode_indptr(num_seqs: int) -> np.ndarray:
    return np.arange(num_seqs + 1, dtype=np.int32)


def _reference(case, qo_indptr):
    scale = 1 / np.sqrt(case.q.shape[2])
    return ref.paged_extend(case.q, qo_indptr, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                            case.kv_last_page_len, case.block_size, case.kv_dtype, scale)


def _shim_both(case, qo_indptr, partition_tokens=None):
    """Paged and contiguous results of the shim backend, with split-K forced when partition_tokens is given."""
    scale = 1 / np.sqrt(case.q.shape[2])
    paged = (case.kv_indptr, case.kv_indices, case.kv_last_page_len, case.block_size)
    out_paged = cuda_cpu.attention(case.q, qo_indptr, case.paged_k, case.paged_v, case.kv_dtype, scale, paged=paged,
                                   partition_tokens=partition_tokens)
    out_contig = cuda_cpu.attention(case.q, qo_indptr, case.contig_k, case.contig_v, case.kv_dtype, scale,
                                    contiguous=(case.kv_start, case.kv_len), partition_tokens=partition_tokens)
    return out_paged, out_contig


def _decode_grid() -> list:
    """Block sizes x GQA groups x KV dtypes. The quick run covers each value of each axis (block size i with
    group i mod 3 and dtype i mod 4, and every dtype at group 8); the full run crosses them all."""
    block_sizes, groups = [1, 2, 8, 16, 32, 128, 256], [1, 4, 8]
    quick = {(b, groups[i % 3], KV_DTYPES[i % 4]) for i, b in enumerate(block_sizes)}
    quick |= {(16, 8, d) for d in KV_DTYPES}
    return [pytest.param(b, g, d, id=f"{b}-{g}-{d}", marks=() if (b, g, d) in quick else pytest.mark.slow)
            for b in block_sizes for g in groups for d in KV_DTYPES]


@pytest.mark.parametrize(("block_size", "group", "kv_dtype"), _decode_grid())
def test_decode_grid(block_size, group, kv_dtype):
    """docs/kernels.md grid through the public surface: all six ragged lengths in one call."""
    rng = np.random.default_rng([block_size, group, len(kv_dtype), 11])
    lengths = rng.permutation(GRID_LENGTHS)
    case = make_case(rng, lengths, 2 * group, 2, 64, block_size, kv_dtype)
    paged = kernels.paged_decode(case.q, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                                 case.kv_last_page_len, block_size, backend=BACKEND, kv_dtype=kv_dtype)
    contig = kernels.contiguous_decode(case.q, case.contig_k, case.contig_v, case.kv_start, case.kv_len,
                                       backend=BACKEND, kv_dtype=kv_dtype)
    indptr = _decode_indptr(len(lengths))
    assert_attention_close(paged, _reference(case, indptr), kv_dtype, indptr)
    np.testing.assert_array_equal(paged, contig)


def _split_k_grid() -> list:
    """Partition lengths x KV dtypes. The quick run takes each dtype once and each partition length once, the
    dtype left over with the longest (cheapest: fewest partitions) length, as the split and the merge do not
    depend on the dtype; the full run crosses them all."""
    partitions = [5, 64, 300]
    quick = set(zip([*partitions, partitions[-1]], KV_DTYPES, strict=True))
    return [pytest.param(p, d, id=f"{p}-{d}", marks=() if (p, d) in quick else pytest.mark.slow)
            for p in partitions for d in KV_DTYPES]


@pytest.mark.parametrize(("partition_tokens", "kv_dtype"), _split_k_grid())
def test_decode_split_k(partition_tokens, kv_dtype):
    """Forced split-K partitions (including ones that cut pages and leave short sequences empty) + merge."""
    rng = np.random.default_rng([partition_tokens, len(kv_dtype), 12])
    case = make_case(rng, rng.permutation(GRID_LENGTHS), 8, 2, 64, 16, kv_dtype)
    indptr = _decode_indptr(len(GRID_LENGTHS))
    paged, contig = _shim_both(case, indptr, partition_tokens)
    assert_attention_close(paged, _reference(case, indptr), kv_dtype, indptr)
    np.testing.assert_array_equal(paged, contig)


def _extend_grid() -> list:
    """Block sizes x GQA groups x KV dtypes. The quick run takes every (block size, group) pair once, with the
    dtypes in turn; the full run crosses them all."""
    block_sizes, groups = [1, 16, 256], [1, 4]
    pairs = [(b, g) for b in block_sizes for g in groups]
    quick = {(b, g, KV_DTYPES[i % len(KV_DTYPES)]) for i, (b, g) in enumerate(pairs)}
    return [pytest.param(b, g, d, id=f"{b}-{g}-{d}", marks=() if (b, g, d) in quick else pytest.mark.slow)
            for b, g in pairs for d in KV_DTYPES]


@pytest.mark.parametrize(("block_size", "group", "kv_dtype"), _extend_grid())
def test_extend_grid(block_size, group, kv_dtype):
    """Causal extend through the public surface: 1..40 new tokens per sequence over the ragged lengths."""
    rng = np.random.default_rng([block_size, group, len(kv_dtype), 13])
    lengths = rng.permutation(GRID_LENGTHS)
    qo_indptr = random_qo_indptr(rng, lengths)
    case = make_case(rng, lengths, 2 * group, 2, 64, block_size, kv_dtype, num_q=int(qo_indptr[-1]))
    paged = kernels.paged_extend(case.q, qo_indptr, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                                 case.kv_last_page_len, block_size, backend=BACKEND, kv_dtype=kv_dtype)
    contig = kernels.contiguous_extend(case.q, qo_indptr, case.contig_k, case.contig_v, case.kv_start, case.kv_len,
                                       backend=BACKEND, kv_dtype=kv_dtype)
    assert_attention_close(paged, _reference(case, qo_indptr), kv_dtype, qo_indptr)
    np.testing.assert_array_equal(paged, contig)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_extend_split_k_whole_prefill(kv_dtype):
    """A whole prompt as one extend (Q = kv_len) split into partitions: most rows see few partitions."""
    rng = np.random.default_rng([len(kv_dtype), 14])
    lengths = [200, 33]
    qo_indptr = np.array([0, 200, 233], dtype=np.int32)
    case = make_case(rng, lengths, 4, 1, 64, 8, kv_dtype, num_q=233)
    paged, contig = _shim_both(case, qo_indptr, partition_tokens=48)
    assert_attention_close(paged, _reference(case, qo_indptr), kv_dtype, qo_indptr)
    np.testing.assert_array_equal(paged, contig)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("head_dim", [80, 96, 128, 256])
def test_other_head_dims(head_dim, kv_dtype):
    """Every head dim's lane layout (16-byte vectors, idle lanes, two vectors per lane at 256 fp32)."""
    rng = np.random.default_rng([head_dim, len(kv_dtype), 15])
    lengths = [1, 17, 97]
    qo_indptr = np.array([0, 1, 4, 9], dtype=np.int32)
    case = make_case(rng, lengths, 8, 2, head_dim, 16, kv_dtype, num_q=9)
    paged, contig = _shim_both(case, qo_indptr, partition_tokens=40)
    assert_attention_close(paged, _reference(case, qo_indptr), kv_dtype, qo_indptr)
    np.testing.assert_array_equal(paged, contig)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    num_seqs=st.integers(1, 4),
    max_len=st.sampled_from([1, 3, 40, 300]),
    block_size=st.integers(1, 256),
    num_kv_heads=st.integers(1, 3),
    group=st.integers(1, 16),
    head_dim=st.sampled_from([64, 80, 96, 128, 256]),
    kv_dtype=st.sampled_from(KV_DTYPES),
    extend=st.booleans(),
    partition_tokens=st.one_of(st.none(), st.integers(8, 120)),
)
def test_random_shapes(seed, num_seqs, max_len, block_size, num_kv_heads, group, head_dim, kv_dtype, extend,
                       partition_tokens):
    """Any block size 1..256, any GQA ratio (padding rows, MQA beyond 8 heads), decode or extend, split or not."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, size=num_seqs)
    qo_indptr = random_qo_indptr(rng, lengths) if extend else _decode_indptr(num_seqs)
    case = make_case(rng, lengths, group * num_kv_heads, num_kv_heads, head_dim, block_size, kv_dtype,
                     num_q=int(qo_indptr[-1]))
    paged, contig = _shim_both(case, qo_indptr, partition_tokens)
    assert_attention_close(paged, _reference(case, qo_indptr), kv_dtype, qo_indptr)
    np.testing.assert_array_equal(paged, contig)


def test_misaligned_pool_is_rejected():
    rng = np.random.default_rng(16)
    case = make_case(rng, [5], 2, 2, 64, 4, "fp32")
    storage = np.empty(case.paged_k.size + 4, dtype=np.float32)
    offset = next(o for o in range(4) if (storage.ctypes.data + 4 * o) % 16)
    shifted_k = storage[offset : offset + case.paged_k.size].reshape(case.paged_k.shape)
    shifted_k[...] = case.paged_k
    with pytest.raises(ValueError, match="16-byte boundary"):
        cuda_cpu.paged_decode(case.q, shifted_k, case.paged_v, case.kv_indptr, case.kv_indices,
                              case.kv_last_page_len, 4, "fp32", 0.125)


def test_results_do_not_depend_on_the_machine(monkeypatch):
    """Same inputs, bit-identical outputs on 1 or 3 OS threads: plans use a fixed SM count, blocks are independent."""
    rng = np.random.default_rng(17)
    case = make_case(rng, [1000, 17, 600], 8, 2, 64, 16, "fp16")
    args = (case.q, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices, case.kv_last_page_len, 16, "fp16",
            0.125)
    monkeypatch.setattr(cuda_cpu, "os_threads", lambda: 3)
    many = cuda_cpu.paged_decode(*args)
    monkeypatch.setattr(cuda_cpu, "os_threads", lambda: 1)
    one = cuda_cpu.paged_decode(*args)
    np.testing.assert_array_equal(many, one)
    assert_attention_close(one, _reference(case, _decode_indptr(3)), "fp16", _decode_indptr(3))
