"""Input checks for the public kernel surface: each problem raises one ValueError naming the
function, the argument, what was expected and what arrived. Nothing is mutated here."""

from __future__ import annotations

import math

import numpy as np

# bf16 pools hold uint16 bits, fp8 (e4m3) pools uint8 codes with a per-tensor scale
STORAGE_DTYPE = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16), "bf16": np.dtype(np.uint16),
                 "fp8": np.dtype(np.uint8)}
MAX_BLOCK_SIZE = 256


def host(a) -> np.ndarray:
    """A NumPy view/copy of a small descriptor array (CuPy arrays are copied to the host)."""
    return a if isinstance(a, np.ndarray) else np.asarray(a.get() if hasattr(a, "get") else a)


def _fail(fn: str, what: str):
    raise ValueError(f"{fn}: {what}")


def check_array(fn, name, a, dtype, shape):
    """`shape` entries are ints or None (any size). Returns the array unchanged."""
    if not (hasattr(a, "shape") and hasattr(a, "dtype") and hasattr(a, "flags")):
        _fail(fn, f"{name} must be an array, got {type(a).__name__}")
    if a.ndim != len(shape) or any(s is not None and s != got for s, got in zip(shape, a.shape, strict=False)):
        _fail(fn, f"{name} must have shape {_shape_words(shape)}, got {tuple(a.shape)}")
    if dtype is not None and a.dtype != dtype:
        _fail(fn, f"{name} must be {np.dtype(dtype)} {_shape_words(shape)}, got {np.dtype(a.dtype)}")
    if not a.flags.c_contiguous:
        _fail(fn, f"{name} must be C-contiguous")
    return a


def _shape_words(shape) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def check_pools(fn, k_pool, v_pool, kv_dtype):
    """Both pools [num_slots, num_kv_heads, head_dim] of the same shape and storage dtype; returns kv_dtype."""
    check_array(fn, "k_pool", k_pool, None, (None, None, None))
    pool_dtype = np.dtype(k_pool.dtype)
    if kv_dtype is None:
        if pool_dtype == np.uint16:
            _fail(fn, "uint16 pools hold bf16 bits: pass kv_dtype='bf16'")
        if pool_dtype == np.uint8:
            _fail(fn, "uint8 pools hold fp8 (e4m3) codes: pass kv_dtype='fp8'")
        kv_dtype = {np.dtype(np.float32): "fp32", np.dtype(np.float16): "fp16"}.get(pool_dtype)
        if kv_dtype is None:
            _fail(fn, f"k_pool dtype must be float32, float16, uint16 (bf16 bits) or uint8 (fp8), got {pool_dtype}")
    if kv_dtype not in STORAGE_DTYPE:
        _fail(fn, f"kv_dtype must be one of {sorted(STORAGE_DTYPE)}, got {kv_dtype!r}")
    if pool_dtype != STORAGE_DTYPE[kv_dtype]:
        _fail(fn, f"kv_dtype={kv_dtype!r} needs {STORAGE_DTYPE[kv_dtype]} pools, got {pool_dtype}")
    check_array(fn, "v_pool", v_pool, k_pool.dtype, tuple(k_pool.shape))
    if k_pool.shape[1] < 1 or k_pool.shape[2] < 1:
        _fail(fn, f"k_pool needs num_kv_heads >= 1 and head_dim >= 1, got shape {tuple(k_pool.shape)}")
    if kv_dtype == "fp8" and k_pool.shape[2] % 2:
        _fail(fn, f"fp8 pools need an even head_dim (kernels read code pairs), got {k_pool.shape[2]}")
    return kv_dtype


def check_kv_scales(fn, kv_dtype, k_scale, v_scale) -> tuple[float, float]:
    """(k_scale, v_scale): positive finite floats; anything but 1.0 only for fp8 pools."""
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not (isinstance(value, int | float | np.floating) and math.isfinite(value) and value > 0):
            _fail(fn, f"{name} must be a positive finite float, got {value!r}")
        if kv_dtype != "fp8" and value != 1.0:
            _fail(fn, f"{name} applies to fp8 pools only (kv_dtype={kv_dtype!r}), got {value!r}")
    return float(k_scale), float(v_scale)


# model dtypes an fp8 cache write quantizes from, by the dtype of the rows (bf16 rows arrive as uint16 bits)
QUANTIZED_WRITE_SOURCES = {np.dtype(np.float32): "fp32", np.dtype(np.float16): "fp16", np.dtype(np.uint16): "bf16"}
F32_NORMAL_RANGE = (float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max))


def check_cache_write_rows(fn, k_pool, v_pool, k_new, v_new, k_scale, v_scale) -> tuple[str | None, tuple]:
    """Pools [num_slots, num_kv_heads, head_dim] and new rows [num_tokens, num_kv_heads, head_dim]; returns
    (source, (k_scale, v_scale)): source None for a copy (rows in the pools' dtype, scales 1.0), or the model
    dtype ("fp32", "fp16", "bf16" for float32, float16, uint16 rows) an fp8 (uint8) pool quantizes from,
    with scales that are normal float32 values."""
    check_array(fn, "k_pool", k_pool, None, (None, None, None))
    check_array(fn, "v_pool", v_pool, k_pool.dtype, tuple(k_pool.shape))
    check_array(fn, "k_new", k_new, None, (None, *k_pool.shape[1:]))
    pool_dtype, new_dtype = np.dtype(k_pool.dtype), np.dtype(k_new.dtype)
    source = None
    if pool_dtype == np.uint8 and new_dtype in QUANTIZED_WRITE_SOURCES:
        source = QUANTIZED_WRITE_SOURCES[new_dtype]
        low, high = F32_NORMAL_RANGE
        for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
            if not (isinstance(value, int | float | np.floating) and low <= value <= high):
                _fail(fn, f"{name} must be a normal float32 in [{low:.3g}, {high:.3g}] for an fp8 write, got {value!r}")
    else:
        if k_scale != 1.0 or v_scale != 1.0:
            _fail(fn, f"k_scale / v_scale apply to fp8 pools written from float32, float16 or uint16 (bf16) rows; "
                      f"got {k_scale!r}, {v_scale!r} for {pool_dtype} pools and {new_dtype} rows")
        check_array(fn, "k_new", k_new, pool_dtype, tuple(k_new.shape))
    check_array(fn, "v_new", v_new, new_dtype, tuple(k_new.shape))
    return source, (float(k_scale), float(v_scale))


def check_query(fn, q, k_pool, scale):
    """q float32 [rows, num_heads, head_dim] matching the pools' head_dim and GQA grouping; returns scale."""
    check_array(fn, "q", q, np.float32, (None, None, k_pool.shape[2]))
    num_heads, num_kv_heads = q.shape[1], k_pool.shape[1]
    if num_heads < 1 or num_heads % num_kv_heads:
        _fail(fn, f"q num_heads={num_heads} must be a positive multiple of the pools' num_kv_heads={num_kv_heads}")
    if scale is None:
        return 1.0 / math.sqrt(q.shape[2])
    if not (isinstance(scale, int | float | np.floating) and math.isfinite(scale)):
        _fail(fn, f"scale must be a finite float, got {scale!r}")
    return float(scale)


def check_block_size(fn, block_size):
    if not isinstance(block_size, int | np.integer) or not 1 <= block_size <= MAX_BLOCK_SIZE:
        _fail(fn, f"block_size must be an int in 1..{MAX_BLOCK_SIZE}, got {block_size!r}")
    return int(block_size)


def check_paged(fn, num_seqs, num_slots, kv_indptr, kv_indices, kv_last_page_len, block_size) -> np.ndarray:
    """CSR page table for num_seqs sequences; returns kv_len int64 [num_seqs]."""
    block_size = check_block_size(fn, block_size)
    check_array(fn, "kv_indptr", kv_indptr, np.int32, (num_seqs + 1,))
    check_array(fn, "kv_indices", kv_indices, np.int32, (None,))
    check_array(fn, "kv_last_page_len", kv_last_page_len, np.int32, (num_seqs,))
    indptr, indices, last = host(kv_indptr), host(kv_indices), host(kv_last_page_len)
    nblocks = np.diff(indptr.astype(np.int64))
    if indptr[0] != 0 or (nblocks < 1).any() or indptr[-1] > len(indices):
        _fail(fn, f"kv_indptr must start at 0, give every sequence >= 1 block and end <= len(kv_indices)="
                  f"{len(indices)}, got {indptr.tolist()[:8]}")
    used = indices[: indptr[-1]]
    num_blocks = num_slots // block_size
    if used.size and (used.min() < 0 or used.max() >= num_blocks):
        _fail(fn, f"kv_indices must lie in 0..{num_blocks - 1} (pool of {num_slots} slots, block_size "
                  f"{block_size}), got {int(used.min())}..{int(used.max())}")
    if num_seqs and (last.min() < 1 or last.max() > block_size):
        _fail(fn, f"kv_last_page_len must lie in 1..{block_size}, got {int(last.min())}..{int(last.max())}")
    return (nblocks - 1) * block_size + last


def check_contiguous(fn, num_seqs, num_slots, kv_start, kv_len) -> np.ndarray:
    """Contiguous extents for num_seqs sequences; returns kv_len int64 [num_seqs]."""
    check_array(fn, "kv_start", kv_start, np.int32, (num_seqs,))
    check_array(fn, "kv_len", kv_len, np.int32, (num_seqs,))
    start, length = host(kv_start).astype(np.int64), host(kv_len).astype(np.int64)
    if num_seqs and (length.min() < 1 or start.min() < 0 or (start + length).max() > num_slots):
        _fail(fn, f"extents must have kv_len >= 1 and lie in the pool's 0..{num_slots - 1} slots")
    return length


def check_qo_indptr(fn, qo_indptr, total_q, kv_len):
    """qo_indptr int32 [num_seqs+1] from 0 to total_q with 1 <= queries <= kv_len per sequence."""
    check_array(fn, "qo_indptr", qo_indptr, np.int32, (len(kv_len) + 1,))
    indptr = host(qo_indptr).astype(np.int64)
    num_q = np.diff(indptr)
    if indptr[0] != 0 or indptr[-1] != total_q or (num_q < 1).any() or (num_q > kv_len).any():
        _fail(fn, f"qo_indptr must run from 0 to total_q={total_q} with 1 <= new tokens <= kv_len per sequence")


def check_slot_mapping(fn, slot_mapping, num_tokens, num_slots):
    check_array(fn, "slot_mapping", slot_mapping, np.int64, (num_tokens,))
    slots = host(slot_mapping)
    written = slots[slots >= 0]
    if written.size and written.max() >= num_slots:
        _fail(fn, f"slot_mapping must be < num_slots={num_slots}, got {int(written.max())}")
    if np.unique(written).size != written.size:
        _fail(fn, "slot_mapping writes one slot twice")


def check_block_pairs(fn, name, pairs, src_blocks, dst_blocks, in_place):
    """int32 [num_pairs, 2] (src, dst) in range, distinct destinations; in place: no destination is a source."""
    check_array(fn, name, pairs, np.int32, (None, 2))
    table = host(pairs)
    if not table.size:
        return
    src, dst = table[:, 0], table[:, 1]
    if src.min() < 0 or src.max() >= src_blocks or dst.min() < 0 or dst.max() >= dst_blocks:
        _fail(fn, f"{name} sources must lie in 0..{src_blocks - 1} and destinations in 0..{dst_blocks - 1}")
    if np.unique(dst).size != dst.size:
        _fail(fn, f"{name} destinations must be distinct")
    if in_place and np.intersect1d(src, dst).size:
        _fail(fn, f"{name}: no destination block may also be a source")
