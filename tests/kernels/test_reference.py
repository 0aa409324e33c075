"""The float64 reference, checked against a direct loop-based attention, and `rel_err` itself."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from kernel_cases import KV_DTYPES, make_case, random_qo_indptr

from workbench.kernels import reference as ref


def _value(stored, kv_dtype: str) -> float:
    """One stored KV element as a Python float, decoded without the reference's code."""
    if kv_dtype == "bf16":
        return struct.unpack("<f", struct.pack("<I", int(stored) << 16))[0]
    if kv_dtype == "fp8":  # e4m3fn: bias 7, subnormals below exponent 1, S.1111.111 is NaN
        bits = int(stored)
        exponent, mantissa = (bits >> 3) & 0xF, bits & 0x7
        if exponent == 0xF and mantissa == 0x7:
            return math.nan
        magnitude = mantissa / 8 * 2.0**-6 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7)
        return -magnitude if bits & 0x80 else magnitude
    return float(stored)


def _loop_attention(q_row, k_rows, v_rows, kv_dtype, scale, num_visible):
    """q_row [num_heads][head_dim] over the first num_visible rows of k_rows/v_rows, plain loops."""
    num_heads, head_dim = q_row.shape
    group = num_heads // k_rows.shape[1]
    out = np.empty((num_heads, head_dim))
    for h in range(num_heads):
        kvh = h // group
        scores = []
        for t in range(num_visible):
            dot = sum(float(q_row[h, d]) * _value(k_rows[t, kvh, d], kv_dtype) for d in range(head_dim))
            scores.append(dot * scale)
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        total = sum(weights)
        for d in range(head_dim):
            out[h, d] = sum(w * _value(v_rows[t, kvh, d], kv_dtype) for t, w in enumerate(weights)) / total
    return out


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("block_size", [1, 3, 4])
def test_reference_decode_and_extend_match_loops(kv_dtype, block_size):
    rng = np.random.default_rng(block_size)
    kv_lens = [1, 5, 7]
    qo_indptr = random_qo_indptr(rng, kv_lens)
    case = make_case(rng, kv_lens, 4, 2, 3, block_size, kv_dtype, num_q=int(qo_indptr[-1]))
    dec_q = case.q[qo_indptr[:-1]]  # one query row per sequence for decode
    scale = 0.7
    paged_dec = ref.paged_decode(dec_q, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                                 case.kv_last_page_len, block_size, kv_dtype, scale)
    contig_dec = ref.contiguous_decode(dec_q, case.contig_k, case.contig_v, case.kv_start, case.kv_len,
                                       kv_dtype, scale)
    paged_ext = ref.paged_extend(case.q, qo_indptr, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                                 case.kv_last_page_len, block_size, kv_dtype, scale)
    contig_ext = ref.contiguous_extend(case.q, qo_indptr, case.contig_k, case.contig_v, case.kv_start,
                                       case.kv_len, kv_dtype, scale)
    assert paged_dec.dtype == np.float64 and paged_ext.dtype == np.float64
    for seq, kv_len in enumerate(kv_lens):
        k = case.contig_k[case.kv_start[seq] : case.kv_start[seq] + kv_len]
        v = case.contig_v[case.kv_start[seq] : case.kv_start[seq] + kv_len]
        expected = _loop_attention(dec_q[seq], k, v, kv_dtype, scale, kv_len)
        np.testing.assert_allclose(paged_dec[seq], expected, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(contig_dec[seq], expected, rtol=1e-12, atol=1e-12)
        num_q = int(qo_indptr[seq + 1] - qo_indptr[seq])
        for j in range(num_q):
            row = int(qo_indptr[seq]) + j
            expected = _loop_attention(case.q[row], k, v, kv_dtype, scale, kv_len - num_q + 1 + j)
            np.testing.assert_allclose(paged_ext[row], expected, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(contig_ext[row], expected, rtol=1e-12, atol=1e-12)


def test_rel_err_values():
    ref_arr = np.array([3.0, 4.0])
    assert ref.rel_err(ref_arr, ref_arr) == 0.0
    assert ref.rel_err(np.array([3.0, 4.5]), ref_arr) == pytest.approx(0.1)
    assert ref.rel_err(np.zeros(2), np.zeros(2)) == 0.0
    assert ref.rel_err(np.array([0.0, 1e-30]), np.zeros(2)) == math.inf


def test_rel_err_never_passes_nan_or_inf():
    rng = np.random.default_rng(0)
    ref_arr = rng.standard_normal((4, 8, 16))
    for bad in (np.nan, np.inf, -np.inf):
        out = ref_arr.astype(np.float32)
        out[2, 3, 5] = bad  # one planted element among 512
        assert not ref.rel_err(out, ref_arr) <= 1.0


def test_rel_err_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="shapes differ"):
        ref.rel_err(np.zeros((2, 3)), np.zeros((3, 2)))


def test_reference_cache_write_skips_negative_slots():
    k_pool = np.zeros((6, 1, 2), np.float32)
    v_pool = np.zeros((6, 1, 2), np.float32)
    k_new = np.arange(6, dtype=np.float32).reshape(3, 1, 2) + 1
    ref.cache_write(k_pool, v_pool, k_new, -k_new, np.array([4, -1, 0], np.int64))
    assert k_pool[:, 0].tolist() == [[5, 6], [0, 0], [0, 0], [0, 0], [1, 2], [0, 0]]
    assert (v_pool == -k_pool).all()


def test_reference_block_copy_and_swap():
    pool = np.arange(8, dtype=np.float32).reshape(8, 1, 1)
    other = pool + 100
    ref.block_copy(pool, other, np.array([[0, 3], [2, 1]], np.int32), 2)
    assert pool[:, 0, 0].tolist() == [0, 1, 4, 5, 4, 5, 0, 1]
    assert other[:, 0, 0].tolist() == [100, 101, 104, 105, 104, 105, 100, 101]
    dst_k = np.zeros((4, 1, 1), np.float32)
    dst_v = np.zeros((4, 1, 1), np.float32)
    ref.block_swap(pool, other, dst_k, dst_v, np.array([[2, 1]], np.int32), 2)
    assert dst_k[:, 0, 0].tolist() == [0, 0, 4, 5]
    assert dst_v[:, 0, 0].tolist() == [0, 0, 104, 105]
