"""Attention and KV-cache kernels behind one validated surface (docs/kernels.md).

Every function checks its inputs (one ValueError naming the argument and what was expected), then
calls the same-named function of the chosen backend module, imported on first use:
"numba" (CPU), "reference" (float64 NumPy), "cuda-cpu" (the CUDA source through the CPU shim),
"cupy" (GPU). Attention calls return a new array; cache_write, block_copy and block_swap mutate
the pools they are given and return None.

`prepare(fn, ...)` does an attention call's checks and planning now and returns a call that only runs
the kernels: what a timer should wrap (the checks read descriptors back to the host; on a GPU that
is a device-to-host copy, no part of the kernel's time).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import shutil
from collections.abc import Callable

import numpy as np

from workbench.kernels import validation as v
from workbench.kernels.reference import rel_err

__all__ = [
    "available_backends", "default_backend", "rel_err", "kv_bytes_read", "paged_kv_len",
    "paged_decode", "contiguous_decode", "paged_extend", "contiguous_extend", "prepare",
    "cache_write", "block_copy", "block_swap",
]

BACKEND_MODULES = {
    "numba": "workbench.kernels.numba_backend",
    "reference": "workbench.kernels.reference",
    "cuda-cpu": "workbench.kernels.cuda_cpu",
    "cupy": "workbench.kernels.cupy_backend",
}
CPU_BACKENDS = ("numba", "reference", "cuda-cpu")


def _cupy_available() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return bool(cupy.cuda.is_available())
    except Exception:  # a broken CUDA install means no GPU backend, not a crash
        return False


def available_backends() -> list[str]:
    """Backends that can run here: their module exists, and cupy sees a GPU, and cuda-cpu finds g++."""
    names = []
    for name, module in BACKEND_MODULES.items():
        if importlib.util.find_spec(module) is None:
            continue
        if (name == "cupy" and not _cupy_available()) or (name == "cuda-cpu" and shutil.which("g++") is None):
            continue
        names.append(name)
    return names


def default_backend() -> str:
    return "cupy" if _cupy_available() else "numba"


def _backend(fn: str, backend: str, arrays):
    if backend not in BACKEND_MODULES:
        raise ValueError(f"{fn}: backend must be one of {sorted(BACKEND_MODULES)}, got {backend!r}")
    if backend in CPU_BACKENDS:
        for name, a in arrays.items():
            if not isinstance(a, np.ndarray):
                raise ValueError(f"{fn}: backend {backend!r} takes NumPy arrays, {name} is {type(a).__name__}")
    return importlib.import_module(BACKEND_MODULES[backend])


def _bound(fn: str, backend: str, arrays, *args) -> Callable[[], object]:
    """The backend's call of attention entry point `fn` with `args`, checked and planned, not yet run: its
    `prepare_<fn>` where it plans launches (the CUDA executors), else the plain function bound to `args`."""
    module = _backend(fn, backend, arrays)
    prepare_fn = getattr(module, f"prepare_{fn}", None)
    return prepare_fn(*args) if prepare_fn is not None else functools.partial(getattr(module, fn), *args)


def paged_kv_len(kv_indptr, kv_last_page_len, block_size: int) -> np.ndarray:
    """Tokens per sequence of a CSR page table, int64 [num_seqs]."""
    nblocks = np.diff(v.host(kv_indptr).astype(np.int64))
    return (nblocks - 1) * block_size + v.host(kv_last_page_len)


def kv_bytes_read(kv_len, num_kv_heads: int, head_dim: int, kv_dtype: str) -> int:
    """K and V bytes of the attended context, each row once: what a decode kernel must read."""
    itemsize = v.STORAGE_DTYPE[kv_dtype].itemsize
    return 2 * int(np.sum(v.host(kv_len), dtype=np.int64)) * num_kv_heads * head_dim * itemsize


def _window(fn: str, window) -> int:
    """A sliding window in tokens (0 = full attention): a query at position p reads p − window + 1 .. p."""
    if isinstance(window, bool) or not isinstance(window, int | np.integer) or window < 0:
        raise ValueError(f"{fn}: window must be an integer >= 0 (0 = full attention), got {window!r}")
    if window > np.iinfo(np.int32).max:
        raise ValueError(f"{fn}: window must fit in int32, got {window}")
    return int(window)


def _prepare_paged_decode(q, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, block_size,
                          backend="numba", kv_dtype=None, scale=None, k_scale=1.0, v_scale=1.0, window=0):
    """`paged_decode` checked and planned; returns the call that runs it."""
    fn = "paged_decode"
    window = _window(fn, window)
    kv_dtype = v.check_pools(fn, k_pool, v_pool, kv_dtype)
    kv_scales = v.check_kv_scales(fn, kv_dtype, k_scale, v_scale)
    scale = v.check_query(fn, q, k_pool, scale)
    v.check_paged(fn, q.shape[0], k_pool.shape[0], kv_indptr, kv_indices, kv_last_page_len, block_size)
    arrays = dict(q=q, k_pool=k_pool, v_pool=v_pool, kv_indptr=kv_indptr, kv_indices=kv_indices,
                  kv_last_page_len=kv_last_page_len)
    return _bound(fn, backend, arrays, q, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, int(block_size),
                  kv_dtype, scale, kv_scales, window)


def _prepare_contiguous_decode(q, k_pool, v_pool, kv_start, kv_len, backend="numba", kv_dtype=None, scale=None,
                               k_scale=1.0, v_scale=1.0, window=0):
    """`contiguous_decode` checked and planned; returns the call that runs it."""
    fn = "contiguous_decode"
    window = _window(fn, window)
    kv_dtype = v.check_pools(fn, k_pool, v_pool, kv_dtype)
    kv_scales = v.check_kv_scales(fn, kv_dtype, k_scale, v_scale)
    scale = v.check_query(fn, q, k_pool, scale)
    v.check_contiguous(fn, q.shape[0], k_pool.shape[0], kv_start, kv_len)
    arrays = dict(q=q, k_pool=k_pool, v_pool=v_pool, kv_start=kv_start, kv_len=kv_len)
    return _bound(fn, backend, arrays, q, k_pool, v_pool, kv_start, kv_len, kv_dtype, scale, kv_scales, window)


def _prepare_paged_extend(q, qo_indptr, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, block_size,
                          backend="numba", kv_dtype=None, scale=None, k_scale=1.0, v_scale=1.0, window=0):
    """`paged_extend` checked and planned; returns the call that runs it."""
    fn = "paged_extend"
    window = _window(fn, window)
    kv_dtype = v.check_pools(fn, k_pool, v_pool, kv_dtype)
    kv_scales = v.check_kv_scales(fn, kv_dtype, k_scale, v_scale)
    scale = v.check_query(fn, q, k_pool, scale)
    num_seqs = v.check_array(fn, "kv_last_page_len", kv_last_page_len, np.int32, (None,)).shape[0]
    kv_len = v.check_paged(fn, num_seqs, k_pool.shape[0], kv_indptr, kv_indices, kv_last_page_len, block_size)
    v.check_qo_indptr(fn, qo_indptr, q.shape[0], kv_len)
    arrays = dict(q=q, qo_indptr=qo_indptr, k_pool=k_pool, v_pool=v_pool, kv_indptr=kv_indptr,
                  kv_indices=kv_indices, kv_last_page_len=kv_last_page_len)
    return _bound(fn, backend, arrays, q, qo_indptr, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len,
                  int(block_size), kv_dtype, scale, kv_scales, window)


def _prepare_contiguous_extend(q, qo_indptr, k_pool, v_pool, kv_start, kv_len, backend="numba", kv_dtype=None,
                               scale=None, k_scale=1.0, v_scale=1.0, window=0):
    """`contiguous_extend` checked and planned; returns the call that runs it."""
    fn = "contiguous_extend"
    window = _window(fn, window)
    kv_dtype = v.check_pools(fn, k_pool, v_pool, kv_dtype)
    kv_scales = v.check_kv_scales(fn, kv_dtype, k_scale, v_scale)
    scale = v.check_query(fn, q, k_pool, scale)
    num_seqs = v.check_array(fn, "kv_start", kv_start, np.int32, (None,)).shape[0]
    lengths = v.check_contiguous(fn, num_seqs, k_pool.shape[0], kv_start, kv_len)
    v.check_qo_indptr(fn, qo_indptr, q.shape[0], lengths)
    arrays = dict(q=q, qo_indptr=qo_indptr, k_pool=k_pool, v_pool=v_pool, kv_start=kv_start, kv_len=kv_len)
    return _bound(fn, backend, arrays, q, qo_indptr, k_pool, v_pool, kv_start, kv_len, kv_dtype, scale, kv_scales,
                  window)


def paged_decode(q, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, block_size,
                 backend="numba", kv_dtype=None, scale=None, k_scale=1.0, v_scale=1.0, window=0):
    """Decode attention over a CSR page table → float32 [num_seqs, num_heads, head_dim]; with `window` W > 0
    each sequence attends only to its positions >= kv_len − W.

    fp8 pools (uint8 e4m3 codes) decode to code value × k_scale / v_scale, vLLM's per-tensor scales.
    """
    return _prepare_paged_decode(q, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, block_size, backend,
                                 kv_dtype, scale, k_scale, v_scale, window)()


def contiguous_decode(q, k_pool, v_pool, kv_start, kv_len, backend="numba", kv_dtype=None, scale=None, k_scale=1.0,
                      v_scale=1.0, window=0):
    """Decode attention over contiguous extents → float32 [num_seqs, num_heads, head_dim] (`window` as in
    paged_decode)."""
    return _prepare_contiguous_decode(q, k_pool, v_pool, kv_start, kv_len, backend, kv_dtype, scale, k_scale,
                                      v_scale, window)()


def paged_extend(q, qo_indptr, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, block_size,
                 backend="numba", kv_dtype=None, scale=None, k_scale=1.0, v_scale=1.0, window=0):
    """Causal extend attention over a CSR page table → float32 [total_q, num_heads, head_dim].

    Sequence s has Q = qo_indptr[s+1] - qo_indptr[s] new tokens (already in the pool) at its last Q
    positions; each attends to every position up to and including its own, or with `window` W > 0
    to the W positions ending at its own ([p − W + 1, p]).
    """
    return _prepare_paged_extend(q, qo_indptr, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, block_size,
                                 backend, kv_dtype, scale, k_scale, v_scale, window)()


def contiguous_extend(q, qo_indptr, k_pool, v_pool, kv_start, kv_len, backend="numba", kv_dtype=None, scale=None,
                      k_scale=1.0, v_scale=1.0, window=0):
    """Causal extend attention over contiguous extents → float32 [total_q, num_heads, head_dim] (`window` as
    in paged_extend)."""
    return _prepare_contiguous_extend(q, qo_indptr, k_pool, v_pool, kv_start, kv_len, backend, kv_dtype, scale,
                                      k_scale, v_scale, window)()


_PREPARED = {paged_decode: _prepare_paged_decode, contiguous_decode: _prepare_contiguous_decode,
             paged_extend: _prepare_paged_extend, contiguous_extend: _prepare_contiguous_extend}


def prepare(fn, *args, **kwargs) -> Callable[[], object]:
    """`fn` (one of the four attention entry points) checked and planned with these arguments, not yet run:
    calling the result runs the kernels and returns what `fn(*args, **kwargs)` would. Call it once: the
    CUDA backends allocate the output when preparing."""
    if fn not in _PREPARED:
        raise ValueError(f"prepare: fn must be one of {', '.join(f.__name__ for f in _PREPARED)}, got {fn!r}")
    return _PREPARED[fn](*args, **kwargs)


def cache_write(k_pool, v_pool, k_new, v_new, slot_mapping, backend="numba", k_scale=1.0, v_scale=1.0) -> None:
    """Mutates the pools: k_new[i], v_new[i] go to slot slot_mapping[i] (int64; negative = skip).

    Rows in the pools' dtype are copied. fp8 pools (uint8) also take rows in the model dtype (float32,
    float16, or bf16 as uint16 bits) and store the e4m3 codes of k_new / k_scale and v_new / v_scale
    (`workbench.kernels.fp8.quantize`, bit for bit in every backend).
    """
    fn = "cache_write"
    source, kv_scales = v.check_cache_write_rows(fn, k_pool, v_pool, k_new, v_new, k_scale, v_scale)
    v.check_slot_mapping(fn, slot_mapping, k_new.shape[0], k_pool.shape[0])
    arrays = dict(k_pool=k_pool, v_pool=v_pool, k_new=k_new, v_new=v_new, slot_mapping=slot_mapping)
    module = _backend(fn, backend, arrays)
    if source is None:
        module.cache_write(k_pool, v_pool, k_new, v_new, slot_mapping)
    else:
        module.cache_write_fp8(k_pool, v_pool, k_new, v_new, slot_mapping, source, kv_scales)


def block_copy(k_pool, v_pool, copies, block_size, backend="numba") -> None:
    """Mutates the pools: for each (src, dst) row of `copies` (int32 [n, 2]), block dst becomes a copy of src."""
    fn = "block_copy"
    block_size = v.check_block_size(fn, block_size)
    v.check_array(fn, "k_pool", k_pool, None, (None, None, None))
    v.check_array(fn, "v_pool", v_pool, k_pool.dtype, tuple(k_pool.shape))
    num_blocks = k_pool.shape[0] // block_size
    v.check_block_pairs(fn, "copies", copies, num_blocks, num_blocks, in_place=True)
    _backend(fn, backend, dict(k_pool=k_pool, v_pool=v_pool, copies=copies)).block_copy(
        k_pool, v_pool, copies, block_size)


def block_swap(src_k, src_v, dst_k, dst_v, moves, block_size, backend="numba") -> None:
    """Mutates dst_k/dst_v: for each (src, dst) row of `moves`, dst block dst gets src block src."""
    fn = "block_swap"
    block_size = v.check_block_size(fn, block_size)
    v.check_array(fn, "src_k", src_k, None, (None, None, None))
    v.check_array(fn, "src_v", src_v, src_k.dtype, tuple(src_k.shape))
    v.check_array(fn, "dst_k", dst_k, src_k.dtype, (None, *src_k.shape[1:]))
    v.check_array(fn, "dst_v", dst_v, src_k.dtype, tuple(dst_k.shape))
    v.check_block_pairs(fn, "moves", moves, src_k.shape[0] // block_size, dst_k.shape[0] // block_size,
                        in_place=False)
    arrays = dict(src_k=src_k, src_v=src_v, dst_k=dst_k, dst_v=dst_v, moves=moves)
    _backend(fn, backend, arrays).block_swap(src_k, src_v, dst_k, dst_v, moves, block_size)
