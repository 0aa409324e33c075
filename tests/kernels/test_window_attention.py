"""Sliding-window attention (hybrid models' window layers) on every CPU kernel backend.

A query at position p reads positions [p − W + 1, p]. After the float64 reference is computed, every
slot before the earliest window of a sequence is poisoned with NaN and the paged table's blocks that
lie wholly before it point at a poisoned spare block (as a hybrid pool's released entries do): a
kernel that reads anything outside the window returns NaN and fails. Paged and contiguous calls
over the same logical KV must agree bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_cases import BF16_NAN_BITS, assert_attention_close, make_case, random_qo_indptr

from workbench import kernels
from workbench.kernels import cuda_cpu
from workbench.kernels import reference as ref

WINDOWS = [1, 7, 128, 4096]
LENGTHS = [1, 7, 8, 9, 130, 300, 4100]  # around block boundaries of 8 and 16, and past the widest window


def _backends() -> list[str]:
    try:
        cuda_cpu.shim_include_dir()
    except cuda_cpu.ShimBuildError:
        return ["numba"]
    return ["numba", "cuda-cpu"]


def _poison_outside(case, first_read: np.ndarray) -> None:
    """Mutates the case: positions < first_read[s] of each sequence become NaN, and its paged table's
    blocks wholly before first_read[s] are replaced by a poisoned spare block."""
    nan = BF16_NAN_BITS if case.kv_dtype == "bf16" else np.nan
    bs = case.block_size
    spare = np.setdiff1d(np.arange(case.paged_k.shape[0] // bs), case.kv_indices)[0]
    for s, first in enumerate(first_read.tolist()):
        blocks = case.kv_indices[case.kv_indptr[s]:case.kv_indptr[s + 1]]
        slots = (blocks[:, None].astype(np.int64) * bs + np.arange(bs)).reshape(-1)[:first]
        case.paged_k[slots] = case.paged_v[slots] = nan
        blocks[:first // bs] = spare
        start = int(case.kv_start[s])
        case.contig_k[start:start + first] = case.contig_v[start:start + first] = nan


def _run(case, qo_indptr, backend, window, extend):
    common = dict(backend=backend, kv_dtype=case.kv_dtype, window=window)
    if extend:
        paged = kernels.paged_extend(case.q, qo_indptr, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                                     case.kv_last_page_len, case.block_size, **common)
        contig = kernels.contiguous_extend(case.q, qo_indptr, case.contig_k, case.contig_v, case.kv_start,
                                           case.kv_len, **common)
    else:
        paged = kernels.paged_decode(case.q, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                                     case.kv_last_page_len, case.block_size, **common)
        contig = kernels.contiguous_decode(case.q, case.contig_k, case.contig_v, case.kv_start, case.kv_len, **common)
    return paged, contig


@pytest.mark.parametrize("extend", [False, True], ids=["decode", "extend"])
@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("backend", _backends())
def test_window_matches_the_reference_and_reads_nothing_outside(backend, window, kv_dtype, extend):
    rng = np.random.default_rng([window, len(kv_dtype), int(extend), len(backend)])
    block_size = 8 if window % 2 else 16
    lengths = rng.permutation(LENGTHS)
    case = make_case(rng, lengths, 4, 2, 64, block_size, kv_dtype,
                     num_q=None if not extend else 0)
    if extend:
        qo_indptr = random_qo_indptr(rng, lengths)
        case.q = rng.standard_normal((int(qo_indptr[-1]), 4, 64), dtype=np.float32)
    else:
        qo_indptr = np.arange(len(lengths) + 1, dtype=np.int32)
    scale = 1 / np.sqrt(64)
    expected = ref.paged_extend(case.q, qo_indptr, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                                case.kv_last_page_len, block_size, kv_dtype, scale, window=window)
    num_q = np.diff(qo_indptr)
    _poison_outside(case, np.maximum(0, case.kv_len - num_q - window + 1))
    paged, contig = _run(case, qo_indptr, backend, window, extend)
    assert_attention_close(paged, expected, kv_dtype, qo_indptr)
    assert np.array_equal(paged, contig), "paged and contiguous windows differ"


@pytest.mark.parametrize("num_q", [1, 37], ids=["decode", "extend"])
@pytest.mark.parametrize("partition_tokens", [16, 64, 200])
def test_window_with_split_k_partitions(partition_tokens, num_q):
    """Split-K partitions tile each block's span from its earliest row's window start (not position 0):
    partitions past the span are empty and carry no weight, and a partition boundary inside the span
    splits the window without losing or double-counting a position."""
    if "cuda-cpu" not in _backends():
        pytest.skip("the CUDA shim does not build here")
    rng = np.random.default_rng([partition_tokens, num_q])
    lengths = [1000, 333, 64]
    case = make_case(rng, lengths, 8, 2, 64, 16, "fp16")
    qo_indptr = np.arange(4, dtype=np.int32) * num_q
    qo_indptr[1:] = np.cumsum(np.minimum(num_q, lengths))
    case.q = rng.standard_normal((int(qo_indptr[-1]), 8, 64), dtype=np.float32)
    scale = 1 / np.sqrt(64)
    expected = ref.paged_extend(case.q, qo_indptr, case.paged_k, case.paged_v, case.kv_indptr, case.kv_indices,
                                case.kv_last_page_len, 16, "fp16", scale, window=100)
    _poison_outside(case, np.maximum(0, case.kv_len - np.diff(qo_indptr) - 100 + 1))
    paged = (case.kv_indptr, case.kv_indices, case.kv_last_page_len, 16)
    out = cuda_cpu.attention(case.q, qo_indptr, case.paged_k, case.paged_v, "fp16", scale, paged=paged,
                             partition_tokens=partition_tokens, window=100)
    assert_attention_close(out, expected, "fp16", qo_indptr)


@pytest.mark.parametrize("window", [1, 5, 40])
def test_reference_window_is_full_attention_over_the_window(window):
    """Each query's windowed result equals full attention over an extent holding only its window."""
    rng = np.random.default_rng(window)
    case = make_case(rng, [50, 3], 4, 2, 64, 8, "fp32")
    qo_indptr = np.array([0, 20, 23], dtype=np.int32)
    case.q = rng.standard_normal((23, 4, 64), dtype=np.float32)
    scale = 0.125
    out = ref.contiguous_extend(case.q, qo_indptr, case.contig_k, case.contig_v, case.kv_start, case.kv_len, "fp32",
                                scale, window=window)
    for s in range(2):
        length, start = int(case.kv_len[s]), int(case.kv_start[s])
        for j, qi in enumerate(range(qo_indptr[s], qo_indptr[s + 1])):
            p = length - (qo_indptr[s + 1] - qo_indptr[s]) + j
            first = max(0, p - window + 1)
            alone = ref.contiguous_decode(case.q[qi:qi + 1], case.contig_k, case.contig_v,
                                          np.array([start + first], np.int32), np.array([p + 1 - first], np.int32),
                                          "fp32", scale)
            np.testing.assert_allclose(out[qi], alone[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("window", [-1, 1.5, True])
def test_bad_window_is_a_clear_error(window):
    case = make_case(np.random.default_rng(0), [5], 2, 1, 64, 4, "fp32")
    with pytest.raises(ValueError, match="window"):
        kernels.contiguous_decode(case.q, case.contig_k, case.contig_v, case.kv_start, case.kv_len, window=window)
