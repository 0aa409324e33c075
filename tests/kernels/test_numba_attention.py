"""Numba decode and extend against the float64 reference on the docs/kernels.md grid, paged and contiguous.

Pools are poisoned with NaN outside the sequences' slots and kernel outputs start as NaN, so a
wrong slot or an unwritten element fails `assert_attention_close`.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_cases import KV_DTYPES, assert_attention_close, make_case, random_qo_indptr

from workbench import kernels
from workbench.kernels import reference as ref

GRID_LENGTHS = [1, 15, 16, 17, 97, 1000]


def _decode_both(case, q):
    paged = kernels.paged_decode(q, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                                 case.kv_last_page_len, case.block_size, kv_dtype=case.kv_dtype)
    contig = kernels.contiguous_decode(q, case.contig_k, case.contig_v, case.kv_start, case.kv_len,
                                       kv_dtype=case.kv_dtype)
    return paged, contig


def _extend_both(case, qo_indptr):
    paged = kernels.paged_extend(case.q, qo_indptr, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                                 case.kv_last_page_len, case.block_size, kv_dtype=case.kv_dtype)
    contig = kernels.contiguous_extend(case.q, qo_indptr, case.contig_k, case.contig_v, case.kv_start, case.kv_len,
                                       kv_dtype=case.kv_dtype)
    return paged, contig


def _reference_decode(case, q):
    return ref.paged_decode(q, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices, case.kv_last_page_len,
                            case.block_size, case.kv_dtype, 1 / np.sqrt(q.shape[2]))


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("block_size", [1, 2, 8, 16, 32, 128, 256])
def test_decode_grid(block_size, group, kv_dtype):
    rng = np.random.default_rng([block_size, group, len(kv_dtype)])
    lengths = rng.permutation(GRID_LENGTHS)
    case = make_case(rng, lengths, 2 * group, 2, 64, block_size, kv_dtype)
    paged, contig = _decode_both(case, case.q)
    decode_indptr = np.arange(len(lengths) + 1)
    assert_attention_close(paged, _reference_decode(case, case.q), kv_dtype, decode_indptr)
    # same logical content, same schedule: the indirection must not change a single bit
    np.testing.assert_array_equal(paged, contig)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_extend_grid(block_size, kv_dtype):
    rng = np.random.default_rng([block_size, len(kv_dtype), 7])
    qo_indptr = random_qo_indptr(rng, GRID_LENGTHS)
    case = make_case(rng, GRID_LENGTHS, 8, 2, 64, block_size, kv_dtype, num_q=int(qo_indptr[-1]))
    paged, contig = _extend_both(case, qo_indptr)
    expected = ref.paged_extend(case.q, qo_indptr, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                                case.kv_last_page_len, block_size, kv_dtype, 1 / 8)
    assert_attention_close(paged, expected, kv_dtype, qo_indptr)
    np.testing.assert_array_equal(paged, contig)


def test_full_prefill_is_causal():
    """Q = kv_len: query j sees exactly positions 0..j (row 0 equals V's first row)."""
    rng = np.random.default_rng(3)
    lengths = [300, 41]
    qo_indptr = np.array([0, 300, 341], dtype=np.int32)
    case = make_case(rng, lengths, 4, 1, 128, 16, "fp32", num_q=341)
    paged, contig = _extend_both(case, qo_indptr)
    expected = ref.contiguous_extend(case.q, qo_indptr, case.contig_k, case.contig_v, case.kv_start, case.kv_len,
                                     "fp32", 1 / np.sqrt(128))
    assert_attention_close(paged, expected, "fp32", qo_indptr)
    first_v = case.contig_v[case.kv_start[0], 0]  # [head_dim]
    np.testing.assert_allclose(paged[0], np.broadcast_to(first_v, (4, 128)), rtol=1e-6)


def test_many_sequences_and_long_splits():
    """Enough sequences to skip KV splitting, and one lone long sequence split into many partitions."""
    rng = np.random.default_rng(11)
    lengths = rng.integers(1, 300, size=80)
    case = make_case(rng, lengths, 8, 8, 32, 16, "fp32")
    paged, contig = _decode_both(case, case.q)
    assert_attention_close(paged, _reference_decode(case, case.q), "fp32", np.arange(81))
    np.testing.assert_array_equal(paged, contig)
    case = make_case(rng, [6000], 4, 1, 64, 8, "bf16")
    paged, _ = _decode_both(case, case.q)
    assert_attention_close(paged, _reference_decode(case, case.q), "bf16", np.arange(2))


@pytest.mark.parametrize("where", ["k", "v"])
def test_planted_nan_fails_the_check(where):
    rng = np.random.default_rng(5)
    case = make_case(rng, [40, 17], 4, 2, 64, 8, "fp16")
    expected = _reference_decode(case, case.q)
    pool = case.paged_k if where == "k" else case.paged_v
    pool[case.kv_indices[1] * 8 + 3, 1, 10] = np.nan  # inside sequence 0's second block
    paged, _ = _decode_both(case, case.q)
    with pytest.raises(AssertionError, match="NaN"):
        assert_attention_close(paged, expected, "fp16", np.arange(3))


def test_wrong_block_table_fails_the_check():
    rng = np.random.default_rng(6)
    case = make_case(rng, [64, 64], 4, 2, 64, 16, "fp32")
    expected = _reference_decode(case, case.q)
    indices = case.kv_indices
    indices[[0, 4]] = indices[[4, 0]]  # swap a block of sequence 0 with one of sequence 1
    paged, _ = _decode_both(case, case.q)
    with pytest.raises(AssertionError, match="rel_err"):
        assert_attention_close(paged, expected, "fp32", np.arange(3))


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 400), min_size=1, max_size=6),
    block_size=st.sampled_from([1, 3, 16, 64, 256]),
    group=st.sampled_from([1, 2, 4, 8]),
    kv_dtype=st.sampled_from(KV_DTYPES),
    head_dim=st.sampled_from([64, 128]),
    seed=st.integers(0, 2**16),
)
def test_random_extend_matches_reference(lengths, block_size, group, kv_dtype, head_dim, seed):
    rng = np.random.default_rng(seed)
    qo_indptr = random_qo_indptr(rng, lengths)
    case = make_case(rng, lengths, 2 * group, 2, head_dim, block_size, kv_dtype, num_q=int(qo_indptr[-1]))
    paged, contig = _extend_both(case, qo_indptr)
    expected = ref.paged_extend(case.q, qo_indptr, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                                case.kv_last_page_len, block_size, kv_dtype, 1 / np.sqrt(head_dim))
    assert_attention_close(paged, expected, kv_dtype, qo_indptr)
    np.testing.assert_array_equal(paged, contig)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_unowned_slots_are_poisoned(kv_dtype):
    case = make_case(np.random.default_rng(1), [5, 2], 2, 1, 8, 4, kv_dtype)
    owned = np.zeros(case.paged_k.shape[0], dtype=bool)
    for seq in range(2):
        owned[ref.paged_slots(case.kv_indptr, case.kv_indices, case.kv_last_page_len, 4, seq)] = True
    values = ref.dequantize(case.paged_k, kv_dtype)  # [num_slots, 1, 8]
    assert owned.sum() == 7
    assert np.isfinite(values[owned]).all() and np.isnan(values[~owned]).all()


def test_results_do_not_depend_on_thread_count(monkeypatch):
    """The work split depends on shapes only, so one thread and many give the same bits."""
    import numba

    from workbench.kernels import numba_backend

    monkeypatch.setattr(numba_backend, "MIN_MACS_PER_THREAD", 1)  # this small case on every thread too
    rng = np.random.default_rng(9)
    case = make_case(rng, [700, 5, 64], 8, 2, 64, 16, "fp32")
    qo_indptr = np.array([0, 30, 31, 40], dtype=np.int32)
    case.q = rng.standard_normal((40, 8, 64), dtype=np.float32)
    before = numba.get_num_threads()
    try:
        results = []
        for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(threads)
            results.append((_decode_both(case, case.q[:3].copy())[0], _extend_both(case, qo_indptr)[0]))
    finally:
        numba.set_num_threads(before)
    for decode, extend in results[1:]:
        np.testing.assert_array_equal(decode, results[0][0])
        np.testing.assert_array_equal(extend, results[0][1])
