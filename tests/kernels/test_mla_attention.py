"""The latent attention (MLA) kernel, dense and sparse, against the float64 reference recomputed from the
logical tokens: the CUDA C through the CPU shim in every thread order, and the Numba twin.

Pools are poisoned (NaN in their storage dtype) outside the sequences' slots, so a wrong slot gives NaN.
The kernel and the reference read the same stored bits, so what is left is the kernel's float32 arithmetic.
Its rounding errors, independent and of either sign, grow as √n·u over a sum of n terms (Higham and Mary's
probabilistic analysis, SIAM J. Sci. Comput. 2019), and the scores' D = kv_lora_rank + qk_rope_head_dim
products dominate: the bound is 8·√D·u in relative norm, the constant the per-head kernels' 64 u bound has
at their head_dim 64 (kernel_cases.TOLERANCE), here 192 u. Rounding the KV to fp16 (1e-4 relative) fails it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from kernel_cases import KV_DTYPES, STORAGE_DTYPE, poisoned_pool, to_storage

from workbench.kernels import cuda_cpu, mla
from workbench.kernels.reference import rel_err

LATENT, ROPE = 512, 64
U = 2.0**-24  # float32 unit roundoff
LENGTHS = [1, 15, 16, 17, 97]
SHIM = True
try:
    cuda_cpu.shim_include_dir()
except cuda_cpu.ShimBuildError:
    SHIM = False


def _case(rng, lengths, num_heads, block_size, kv_dtype, kv_scale):
    """q, a paged pool and a contiguous pool holding the same logical rows, and both address maps."""
    lengths = np.asarray(lengths, dtype=np.int64)
    nblocks = -(-lengths // block_size)
    total_blocks = int(nblocks.sum()) + 2
    perm = rng.permutation(total_blocks).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(nblocks)]).astype(np.int32)
    kv_indices = perm[: kv_indptr[-1]].copy()
    last = (lengths - (nblocks - 1) * block_size).astype(np.int32)
    kv_start = (np.concatenate([[0], np.cumsum(lengths)[:-1]]) + 3 * np.arange(len(lengths))).astype(np.int32)
    paged = poisoned_pool(total_blocks * block_size, 1, LATENT + ROPE, kv_dtype)[:, 0]
    contig = poisoned_pool(int(kv_start[-1] + lengths[-1]) + 2, 1, LATENT + ROPE, kv_dtype)[:, 0]
    for seq, n in enumerate(lengths):
        rows = to_storage(rng.standard_normal((n, LATENT + ROPE), dtype=np.float32), kv_dtype, kv_scale)
        blocks = kv_indices[kv_indptr[seq]: kv_indptr[seq + 1]].astype(np.int64)
        slots = (blocks[:, None] * block_size + np.arange(block_size)).reshape(-1)[:n]
        paged[slots] = rows
        contig[kv_start[seq]: kv_start[seq] + n] = rows
    q_latent = rng.standard_normal((len(lengths), num_heads, LATENT), dtype=np.float32)
    q_rope = rng.standard_normal((len(lengths), num_heads, ROPE), dtype=np.float32)
    return q_latent, q_rope, paged, (kv_indptr, kv_indices, last), contig, (kv_start, lengths.astype(np.int32))


def _selection(rng, lengths, topk):
    """Per sequence min(kv_len, topk) distinct positions, in random order."""
    chosen = [rng.permutation(int(n))[: min(int(n), topk)].astype(np.int32) for n in lengths]
    indptr = np.concatenate([[0], np.cumsum([len(c) for c in chosen])]).astype(np.int32)
    return indptr, np.concatenate(chosen).astype(np.int32)


def _bound() -> float:
    """The relative-norm bound of the module docstring."""
    return 8 * math.sqrt(LATENT + ROPE) * U


def _check(out, expected):
    assert out.dtype == np.float32 and out.shape == expected.shape
    for seq in range(out.shape[0]):
        err = rel_err(out[seq], expected[seq])
        assert err <= _bound(), f"sequence {seq}: rel_err {err:.3g} > bound {_bound():.3g}"


GRID = [(b, d, s) for b in (16, 64) for d in KV_DTYPES for s in (False, True)]


@pytest.mark.skipif(not SHIM, reason="the cuda-cpu shim needs CUDA 13 headers")
@pytest.mark.parametrize("order", ["index", "reversed", "shuffled"])
@pytest.mark.parametrize(("block_size", "kv_dtype", "sparse"), GRID)
def test_shim_matches_the_reference_in_every_thread_order(block_size, kv_dtype, sparse, order):
    rng = np.random.default_rng([block_size, len(kv_dtype), sparse, 39])
    kv_scale = 0.5 if kv_dtype == "fp8" else 1.0
    q_lat, q_rope, paged, table, contig, extents = _case(rng, LENGTHS, 12, block_size, kv_dtype, kv_scale)
    selected = _selection(rng, LENGTHS, 10) if sparse else None
    scale = 1 / np.sqrt(128 + ROPE)
    expected = mla.paged_mla_decode(q_lat, q_rope, paged, *table, block_size, backend="reference", kv_dtype=kv_dtype,
                                    scale=scale, kv_scale=kv_scale, selected=selected)
    cuda_cpu.set_thread_order(order)
    try:
        out = mla.paged_mla_decode(q_lat, q_rope, paged, *table, block_size, backend="cuda-cpu", kv_dtype=kv_dtype,
                                   scale=scale, kv_scale=kv_scale, selected=selected)
        contiguous = mla.contiguous_mla_decode(q_lat, q_rope, contig, *extents, backend="cuda-cpu", kv_dtype=kv_dtype,
                                               scale=scale, kv_scale=kv_scale, selected=selected)
    finally:
        cuda_cpu.set_thread_order("shuffled")
    _check(out, expected)
    np.testing.assert_array_equal(out, contiguous)  # the indirection is the only difference


@pytest.mark.parametrize(("block_size", "kv_dtype", "sparse"), GRID)
def test_numba_twin_matches_the_reference(block_size, kv_dtype, sparse):
    rng = np.random.default_rng([block_size, len(kv_dtype), sparse, 40])
    kv_scale = 2.0 if kv_dtype == "fp8" else 1.0
    q_lat, q_rope, paged, table, contig, extents = _case(rng, LENGTHS, 16, block_size, kv_dtype, kv_scale)
    selected = _selection(rng, LENGTHS, 12) if sparse else None
    kw = dict(kv_dtype=kv_dtype, kv_scale=kv_scale, selected=selected)
    expected = mla.paged_mla_decode(q_lat, q_rope, paged, *table, block_size, backend="reference", **kw)
    out = mla.paged_mla_decode(q_lat, q_rope, paged, *table, block_size, backend="numba", **kw)
    contiguous = mla.contiguous_mla_decode(q_lat, q_rope, contig, *extents, backend="numba", **kw)
    _check(out, expected)
    np.testing.assert_array_equal(out, contiguous)


def test_the_bound_fails_an_fp16_rounding_of_the_kv():
    """An error of the size of fp16 rounding (a kernel reading fp32 rows through half) is caught."""
    rng = np.random.default_rng(5)
    q_lat, q_rope, paged, table, _, _ = _case(rng, LENGTHS, 12, 16, "fp32", 1.0)
    exact = mla.paged_mla_decode(q_lat, q_rope, paged, *table, 16, backend="reference")
    halved = mla.paged_mla_decode(q_lat, q_rope, paged.astype(np.float16).astype(np.float32), *table, 16,
                                  backend="reference")
    assert min(rel_err(halved[s], exact[s]) for s in range(len(LENGTHS))) > 10 * _bound()


def test_the_sparse_reference_is_the_dense_one_over_the_selected_rows():
    """Selecting every position in order is dense attention; selecting a subset is dense attention over a
    pool holding only those rows."""
    rng = np.random.default_rng(7)
    q_lat, q_rope, paged, table, contig, extents = _case(rng, [40], 4, 16, "fp32", 1.0)
    every = (np.array([0, 40], dtype=np.int32), np.arange(40, dtype=np.int32))
    dense = mla.contiguous_mla_decode(q_lat, q_rope, contig, *extents, backend="reference")
    np.testing.assert_array_equal(mla.contiguous_mla_decode(q_lat, q_rope, contig, *extents, backend="reference",
                                                            selected=every), dense)
    picked = np.array([3, 30, 7, 21], dtype=np.int32)
    sub_pool = contig[extents[0][0] + picked]
    sub = mla.contiguous_mla_decode(q_lat, q_rope, sub_pool, np.array([0], np.int32), np.array([4], np.int32),
                                    backend="reference")
    sparse = mla.contiguous_mla_decode(q_lat, q_rope, contig, *extents, backend="reference",
                                       selected=(np.array([0, 4], np.int32), picked))
    np.testing.assert_allclose(sparse, sub, rtol=1e-15)
    assert rel_err(sparse, dense) > 1e-3  # the selection matters


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(selected=(np.array([0, 0], np.int32), np.zeros(0, np.int32))), "every sequence >= 1 position"),
    (dict(selected=(np.array([0, 1], np.int32), np.array([40], np.int32))), r"sel_positions must lie in \[0, kv_len\)"),
    (dict(kv_scale=0.5), "applies to fp8 pools only"),
])
def test_bad_input_is_one_clear_error(kwargs, message):
    rng = np.random.default_rng(8)
    q_lat, q_rope, _, _, contig, extents = _case(rng, [40], 4, 16, "fp16", 1.0)
    with pytest.raises(ValueError, match=message):
        mla.contiguous_mla_decode(q_lat, q_rope, contig, *extents, **kwargs)


def test_storage_dtypes_are_the_per_head_kernels():
    assert {d: np.dtype(t) for d, t in STORAGE_DTYPE.items()} == {
        "fp32": np.float32, "fp16": np.float16, "bf16": np.uint16, "fp8": np.uint8}


def _cupy_device():
    """cupy, or None where it is not installed or sees no device."""
    try:
        import cupy
        return cupy if cupy.cuda.is_available() else None
    except Exception:  # a broken CUDA install means no GPU here
        return None


@pytest.mark.gpu
@pytest.mark.skipif(_cupy_device() is None, reason="no CUDA device visible to CuPy")
@pytest.mark.parametrize(("block_size", "kv_dtype", "sparse"), GRID)
def test_gpu_matches_the_reference(block_size, kv_dtype, sparse):
    cp = _cupy_device()
    rng = np.random.default_rng([block_size, len(kv_dtype), sparse, 41])
    kv_scale = 0.5 if kv_dtype == "fp8" else 1.0
    q_lat, q_rope, paged, table, _, _ = _case(rng, LENGTHS, 16, block_size, kv_dtype, kv_scale)
    selected = _selection(rng, LENGTHS, 10) if sparse else None
    kw = dict(kv_dtype=kv_dtype, kv_scale=kv_scale)
    expected = mla.paged_mla_decode(q_lat, q_rope, paged, *table, block_size, backend="reference", selected=selected,
                                    **kw)
    device = [cp.asarray(a) for a in (q_lat, q_rope, paged, *table)]
    out = mla.paged_mla_decode(*device, block_size, backend="cupy", **kw,
                               selected=None if selected is None else tuple(cp.asarray(a) for a in selected))
    _check(cp.asnumpy(out), expected)
