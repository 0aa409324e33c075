"""Numba CPU backend: the docs/kernels.md kernel signatures over NumPy arrays (inputs already validated).

Every call reaches the same compiled attention kernel: fp32 pools as float32 rows
[num_slots * num_kv_heads, head_dim], fp16/bf16 pools as uint16 bits plus an int format code, the
unused pair as placeholders, and paged or contiguous tables side by side with a flag. The cache ops
see byte views. One specialization each keeps first-call compile time small.

Outputs are allocated NaN-filled, so an element a kernel fails to write never passes verification.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from workbench.intmath import cdiv
from workbench.kernels.numba_attention import TILE_TOKENS, attend_items, merge_partials
from workbench.kernels.numba_cache import copy_blocks, scatter_rows, scatter_rows_fp8
from workbench.kernels.numba_convert import KV_CODE

QUERY_ROWS_PER_ITEM = 64  # extend: queries × heads sharing one pass over K/V (accumulators stay in L1/L2)
MIN_WORK_ITEMS = 64  # split KV into partitions when fewer query chunks than this
MIN_PART_TOKENS = 512  # never split finer than this: the merge costs a partial output per partition
# a thread is handed at least this many multiply-adds (query rows x KV tokens x head_dim): a hand-off to the
# pool costs ~0.1-0.2 ms, as much as ~1M of them, so smaller calls (a small model's decode step) run inline
MIN_MACS_PER_THREAD = 4_000_000
_EMPTY_I32 = np.zeros(1, dtype=np.int32)
_NO_BITS = np.zeros((1, 1, 1), dtype=np.uint16)


def _kernel_pools(k_pool, v_pool, kv_dtype):
    """(k_rows, v_rows, k_bits, v_bits) as `attention_partials` takes them; the unused pair is a placeholder.
    fp8 pools [S, H, D] of uint8 codes become uint16 [S, H, D / 2] views (two codes per word)."""
    if kv_dtype == "fp32":
        rows = lambda pool: pool.reshape(-1, pool.shape[2])  # [num_slots * num_kv_heads, head_dim], a view
        return rows(k_pool), rows(v_pool), _NO_BITS, _NO_BITS
    no_rows = np.zeros((1, k_pool.shape[2]), dtype=np.float32)
    return no_rows, no_rows, k_pool.view(np.uint16), v_pool.view(np.uint16)


def _bytes(pool: np.ndarray) -> np.ndarray:
    row_bytes = pool.shape[1] * pool.shape[2] * pool.dtype.itemsize
    return pool.view(np.uint8).reshape(pool.shape[0], row_bytes)  # [num_slots, row_bytes]


def _plan(qo_indptr, num_heads):
    """Query chunks (seq, q_begin, q_end) and the KV partition length; depends on shapes only, so a
    given input always runs the same floating-point schedule whatever the thread count."""
    num_q = np.diff(qo_indptr).astype(np.int64)  # [num_seqs]
    queries_per_chunk = max(1, QUERY_ROWS_PER_ITEM // num_heads)
    chunks_per_seq = (num_q + queries_per_chunk - 1) // queries_per_chunk
    chunk_seq = np.repeat(np.arange(len(num_q), dtype=np.int64), chunks_per_seq)  # [num_chunks]
    first_chunk = np.cumsum(chunks_per_seq) - chunks_per_seq
    within = np.arange(len(chunk_seq)) - first_chunk[chunk_seq]
    chunk_q_begin = qo_indptr[chunk_seq].astype(np.int64) + within * queries_per_chunk
    chunk_q_end = np.minimum(chunk_q_begin + queries_per_chunk, qo_indptr[chunk_seq + 1])
    return chunk_seq, chunk_q_begin, chunk_q_end


def _part_tokens(num_items: int, max_len: int) -> int:
    if num_items >= MIN_WORK_ITEMS:
        return max_len
    wanted_parts = cdiv(MIN_WORK_ITEMS, num_items)
    part = cdiv(cdiv(max_len, wanted_parts), TILE_TOKENS) * TILE_TOKENS
    return max(MIN_PART_TOKENS, part)


def _attention(q, qo_indptr, k_pool, v_pool, paged, kv_indptr, kv_indices, block_size, kv_start, kv_len,
               kv_dtype, scale, kv_scales, window):
    """kv_scales = (k_scale, v_scale): k_scale folds into the softmax scale, v_scale multiplies the output
    (both 1.0 except for fp8 pools, whose codes decode to value / scale); window: 0 or a sliding window."""
    out = _attention_unit(q, qo_indptr, k_pool, v_pool, paged, kv_indptr, kv_indices, block_size, kv_start, kv_len,
                          kv_dtype, scale * kv_scales[0], window)
    if kv_scales[1] != 1.0:
        out *= np.float32(kv_scales[1])
    return out


def _attention_unit(q, qo_indptr, k_pool, v_pool, paged, kv_indptr, kv_indices, block_size, kv_start, kv_len,
                    kv_dtype, scale, window):
    num_kv_heads = k_pool.shape[1]
    chunk_seq, chunk_q_begin, chunk_q_end = _plan(qo_indptr, q.shape[1])
    max_len = int(kv_len.max())
    part_tokens = _part_tokens(len(chunk_seq), max_len)
    num_parts = cdiv(max_len, part_tokens)
    part_out = np.full((num_parts, *q.shape), np.nan, dtype=np.float32)
    part_m = np.full((num_parts, *q.shape[:2]), np.nan, dtype=np.float32)
    part_l = np.full((num_parts, *q.shape[:2]), np.nan, dtype=np.float32)
    args = (q, qo_indptr, _kernel_pools(k_pool, v_pool, kv_dtype), num_kv_heads, KV_CODE[kv_dtype], paged,
            (kv_indptr, kv_indices, kv_start, kv_len), block_size, np.float32(scale), np.int64(window))
    parts = (part_out, part_m, part_l)
    macs = int(np.diff(qo_indptr).astype(np.int64) @ kv_len.astype(np.int64)) * q.shape[1] * q.shape[2]
    _attend_in_threads(args, (chunk_seq, chunk_q_begin, chunk_q_end), part_tokens, parts, macs)
    if num_parts == 1:
        return part_out[0]
    out = np.full(q.shape, np.nan, dtype=np.float32)  # [total_q, num_heads, head_dim]
    merge_partials(qo_indptr, kv_len, part_tokens, part_out, part_m, part_l, out)
    return out


def _attend_in_threads(args, chunks, part_tokens, parts, macs: int) -> None:
    """Every work item, on up to numba.get_num_threads() threads (one per MIN_MACS_PER_THREAD of the call's
    `macs`): thread i runs items i, i + threads, ... (so long and short sequences spread evenly). Each item
    writes only its own outputs, so the bits do not depend on the thread count or on which thread ran what."""
    num_items = len(chunks[0]) * parts[0].shape[0]
    threads = min(numba.get_num_threads(), num_items, max(1, macs // MIN_MACS_PER_THREAD))
    if threads <= 1:
        attend_items(*args, chunks, part_tokens, parts, 0, 1)
        return
    run = lambda first: attend_items(*args, chunks, part_tokens, parts, first, threads)
    list(_thread_pool().map(run, range(threads)))  # list(): wait for all, re-raise the first error


_POOL: list[ThreadPoolExecutor] = []


def _thread_pool() -> ThreadPoolExecutor:
    """One pool per process, as large as Numba's thread limit (get_num_threads never exceeds it)."""
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(max_workers=numba.config.NUMBA_NUM_THREADS,
                                        thread_name_prefix="numba-attention"))
    return _POOL[0]


# A forked child (sweep workers) inherits the pool object but none of its threads: it must make its own.
os.register_at_fork(after_in_child=_POOL.clear)


def _paged_len(kv_indptr, kv_last_page_len, block_size):
    return ((np.diff(kv_indptr) - 1) * block_size + kv_last_page_len).astype(np.int32)


def _decode_indptr(num_seqs: int) -> np.ndarray:
    return np.arange(num_seqs + 1, dtype=np.int32)


def paged_decode(q, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, block_size, kv_dtype, scale,
                 kv_scales=(1.0, 1.0), window=0):
    kv_len = _paged_len(kv_indptr, kv_last_page_len, block_size)
    return _attention(q, _decode_indptr(q.shape[0]), k_pool, v_pool, True, kv_indptr, kv_indices, block_size,
                      _EMPTY_I32, kv_len, kv_dtype, scale, kv_scales, window)


def contiguous_decode(q, k_pool, v_pool, kv_start, kv_len, kv_dtype, scale, kv_scales=(1.0, 1.0),
                      window=0):
    return _attention(q, _decode_indptr(q.shape[0]), k_pool, v_pool, False, _EMPTY_I32, _EMPTY_I32, 1,
                      kv_start, kv_len, kv_dtype, scale, kv_scales, window)


def paged_extend(q, qo_indptr, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, block_size, kv_dtype, scale,
                 kv_scales=(1.0, 1.0), window=0):
    kv_len = _paged_len(kv_indptr, kv_last_page_len, block_size)
    return _attention(q, qo_indptr, k_pool, v_pool, True, kv_indptr, kv_indices, block_size, _EMPTY_I32, kv_len,
                      kv_dtype, scale, kv_scales, window)


def contiguous_extend(q, qo_indptr, k_pool, v_pool, kv_start, kv_len, kv_dtype, scale, kv_scales=(1.0, 1.0),
                      window=0):
    return _attention(q, qo_indptr, k_pool, v_pool, False, _EMPTY_I32, _EMPTY_I32, 1, kv_start, kv_len,
                      kv_dtype, scale, kv_scales, window)


def cache_write(k_pool, v_pool, k_new, v_new, slot_mapping) -> None:
    scatter_rows(_bytes(k_pool), _bytes(k_new), slot_mapping)
    scatter_rows(_bytes(v_pool), _bytes(v_new), slot_mapping)


def cache_write_fp8(k_pool, v_pool, k_new, v_new, slot_mapping, source, kv_scales) -> None:
    """fp8 pools get the e4m3 codes of k_new / k_scale and v_new / v_scale (rows in model dtype `source`)."""
    bits_dtype = np.uint32 if source == "fp32" else np.uint16  # float32 rows as their bits: one kernel body
    for pool, rows, kv_scale in ((k_pool, k_new, kv_scales[0]), (v_pool, v_new, kv_scales[1])):
        row_elems = pool.shape[1] * pool.shape[2]
        scatter_rows_fp8(pool.reshape(-1, row_elems), rows.view(bits_dtype).reshape(-1, row_elems), slot_mapping,
                         KV_CODE[source], np.float32(kv_scale))


def block_copy(k_pool, v_pool, copies, block_size) -> None:
    copy_blocks(_bytes(k_pool), _bytes(k_pool), copies, block_size)
    copy_blocks(_bytes(v_pool), _bytes(v_pool), copies, block_size)


def block_swap(src_k, src_v, dst_k, dst_v, moves, block_size) -> None:
    copy_blocks(_bytes(src_k), _bytes(dst_k), moves, block_size)
    copy_blocks(_bytes(src_v), _bytes(dst_v), moves, block_size)
