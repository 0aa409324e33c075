"""Float64 NumPy reference for every kernel op, and the verification metric `rel_err`.

Same positional signatures as the other backends (docs/kernels.md); inputs are already validated by
`workbench.kernels`. Attention results are float64 (the reference is what float32 kernels are
measured against); the in-place ops copy exactly like the kernels do. Written for clarity, not
speed: one sequence at a time, gathering only the rows that sequence attends to.
"""

from __future__ import annotations

import math

import numpy as np

from workbench.kernels import fp8


def rel_err(out, ref) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; inf when `out` holds a NaN or inf, so a NaN never passes."""
    out64 = np.asarray(out, dtype=np.float64)
    ref64 = np.asarray(ref, dtype=np.float64)
    if out64.shape != ref64.shape:
        raise ValueError(f"rel_err: shapes differ, out {out64.shape} vs ref {ref64.shape}")
    if not np.isfinite(out64).all():
        return float("inf")
    diff_norm = _norm(out64 - ref64)
    ref_norm = _norm(ref64)
    if ref_norm == 0.0:
        return 0.0 if diff_norm == 0.0 else float("inf")
    return diff_norm / ref_norm


def _norm(x: np.ndarray) -> float:
    """Euclidean norm by NumPy's pairwise sum: np.linalg.norm is a BLAS dot, whose last bit depends on
    the BLAS thread count."""
    return math.sqrt(float(np.sum(np.square(x))))


def dequantize(rows: np.ndarray, kv_dtype: str, kv_scale: float = 1.0) -> np.ndarray:
    """KV rows in their storage dtype → float64 (bf16 arrives as uint16 bits: the top half of a float32;
    fp8 as uint8 e4m3 codes, times their per-tensor scale)."""
    if kv_dtype == "bf16":
        return (rows.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if kv_dtype == "fp8":
        return fp8.E4M3_VALUES[rows].astype(np.float64) * kv_scale
    return rows.astype(np.float64)


def paged_slots(kv_indptr, kv_indices, kv_last_page_len, block_size: int, seq: int) -> np.ndarray:
    """The pool slots of sequence `seq` in logical order, int64 [kv_len]."""
    blocks = kv_indices[kv_indptr[seq] : kv_indptr[seq + 1]].astype(np.int64)  # [nblocks]
    slots = (blocks[:, None] * block_size + np.arange(block_size)).reshape(-1)  # [nblocks * block_size]
    kv_len = (len(blocks) - 1) * block_size + int(kv_last_page_len[seq])
    return slots[:kv_len]


def contiguous_slots(kv_start, kv_len, seq: int) -> np.ndarray:
    """The pool slots of sequence `seq` in logical order, int64 [kv_len]."""
    return np.arange(int(kv_start[seq]), int(kv_start[seq]) + int(kv_len[seq]), dtype=np.int64)


def _attend(q, k, v, scale: float, num_visible, window: int = 0) -> np.ndarray:
    """Softmax attention of each query row over the first `num_visible[i]` K/V rows, float64; with
    `window` W > 0 only over the last W of them (rows >= num_visible[i] − W).

    q [num_q, num_heads, head_dim]; k, v [kv_len, num_kv_heads, head_dim]; num_visible [num_q].
    Query head h reads kv head h // (num_heads // num_kv_heads).
    """
    num_q, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    q64 = q.astype(np.float64).reshape(num_q, k.shape[1], group, head_dim)  # [num_q, kvh, group, D]
    scores = np.einsum("qhgd,lhd->qhgl", q64, k) * scale  # [num_q, kvh, group, kv_len]
    visible = np.arange(k.shape[0])[None, :] < np.asarray(num_visible)[:, None]  # [num_q, kv_len]
    if window:
        visible &= np.arange(k.shape[0])[None, :] >= np.asarray(num_visible)[:, None] - window
    scores = np.where(visible[:, None, None, :], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    out = np.einsum("qhgl,lhd->qhgd", weights, v)  # [num_q, kvh, group, D]
    return out.reshape(num_q, num_heads, head_dim)


def _decode(q, k_pool, v_pool, slots_of, kv_dtype, scale, kv_scales, window) -> np.ndarray:
    out = np.empty(q.shape, dtype=np.float64)  # [num_seqs, num_heads, head_dim]
    for seq in range(q.shape[0]):
        slots = slots_of(seq)
        k = dequantize(k_pool[slots], kv_dtype, kv_scales[0])  # [kv_len, num_kv_heads, head_dim]
        v = dequantize(v_pool[slots], kv_dtype, kv_scales[1])
        out[seq] = _attend(q[seq : seq + 1], k, v, scale, [len(slots)], window)[0]
    return out


def _extend(q, qo_indptr, k_pool, v_pool, slots_of, kv_dtype, scale, kv_scales, window) -> np.ndarray:
    out = np.empty(q.shape, dtype=np.float64)  # [total_q, num_heads, head_dim]
    for seq in range(len(qo_indptr) - 1):
        q_begin, q_end = int(qo_indptr[seq]), int(qo_indptr[seq + 1])
        slots = slots_of(seq)
        kv_len, num_q = len(slots), q_end - q_begin
        # query j sits at position kv_len - num_q + j and sees positions 0..kv_len - num_q + j
        num_visible = kv_len - num_q + 1 + np.arange(num_q)
        k = dequantize(k_pool[slots], kv_dtype, kv_scales[0])
        v = dequantize(v_pool[slots], kv_dtype, kv_scales[1])
        out[q_begin:q_end] = _attend(q[q_begin:q_end], k, v, scale, num_visible, window)
    return out


def paged_decode(q, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, block_size, kv_dtype, scale,
                 kv_scales=(1.0, 1.0), window=0):
    """Decode attention over a CSR page table → float64 [num_seqs, num_heads, head_dim]."""
    slots_of = lambda seq: paged_slots(kv_indptr, kv_indices, kv_last_page_len, block_size, seq)
    return _decode(q, k_pool, v_pool, slots_of, kv_dtype, scale, kv_scales, window)


def contiguous_decode(q, k_pool, v_pool, kv_start, kv_len, kv_dtype, scale, kv_scales=(1.0, 1.0), window=0):
    """Decode attention over contiguous extents → float64 [num_seqs, num_heads, head_dim]."""
    slots_of = lambda seq: contiguous_slots(kv_start, kv_len, seq)
    return _decode(q, k_pool, v_pool, slots_of, kv_dtype, scale, kv_scales, window)


def paged_extend(q, qo_indptr, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, block_size, kv_dtype, scale,
                 kv_scales=(1.0, 1.0), window=0):
    """Causal extend attention over a CSR page table → float64 [total_q, num_heads, head_dim]."""
    slots_of = lambda seq: paged_slots(kv_indptr, kv_indices, kv_last_page_len, block_size, seq)
    return _extend(q, qo_indptr, k_pool, v_pool, slots_of, kv_dtype, scale, kv_scales, window)


def contiguous_extend(q, qo_indptr, k_pool, v_pool, kv_start, kv_len, kv_dtype, scale, kv_scales=(1.0, 1.0),
                      window=0):
    """Causal extend attention over contiguous extents → float64 [total_q, num_heads, head_dim]."""
    slots_of = lambda seq: contiguous_slots(kv_start, kv_len, seq)
    return _extend(q, qo_indptr, k_pool, v_pool, slots_of, kv_dtype, scale, kv_scales, window)


def cache_write(k_pool, v_pool, k_new, v_new, slot_mapping) -> None:
    """Mutates the pools: row i of k_new/v_new goes to slot slot_mapping[i]; negative slots are skipped."""
    keep = slot_mapping >= 0
    k_pool[slot_mapping[keep]] = k_new[keep]
    v_pool[slot_mapping[keep]] = v_new[keep]


def cache_write_fp8(k_pool, v_pool, k_new, v_new, slot_mapping, source, kv_scales) -> None:
    """Mutates the fp8 pools: row i of k_new/v_new (model dtype `source`; bf16 as uint16 bits) goes to slot
    slot_mapping[i] as `fp8.quantize(row, scale)`; negative slots are skipped."""
    keep = slot_mapping >= 0
    for pool, rows, kv_scale in ((k_pool, k_new, kv_scales[0]), (v_pool, v_new, kv_scales[1])):
        if source == "bf16":  # the top halves of float32 bits; fp16 and fp32 rows quantize as they are
            rows = (rows.astype(np.uint32) << 16).view(np.float32)
        pool[slot_mapping[keep]] = fp8.quantize(rows[keep], kv_scale)


def block_copy(k_pool, v_pool, copies, block_size) -> None:
    """Mutates the pools: block dst gets a copy of block src for every (src, dst) row of `copies`."""
    for src, dst in copies.astype(np.int64):
        for pool in (k_pool, v_pool):
            pool[dst * block_size : (dst + 1) * block_size] = pool[src * block_size : (src + 1) * block_size]


def block_swap(src_k, src_v, dst_k, dst_v, moves, block_size) -> None:
    """Mutates dst_k/dst_v: block dst of the dst pools gets block src of the src pools per (src, dst) row."""
    for src, dst in moves.astype(np.int64):
        dst_k[dst * block_size : (dst + 1) * block_size] = src_k[src * block_size : (src + 1) * block_size]
        dst_v[dst * block_size : (dst + 1) * block_size] = src_v[src * block_size : (src + 1) * block_size]
