"""Latent attention (MLA) decode over a latent KV pool, behind one validated surface (docs/kernels.md).

The pool holds one row per token, [latent c (kv_lora_rank) | rotary key (qk_rope_head_dim)], shared by every
query head. The query is in absorbed form: per head a kv_lora_rank latent query and a qk_rope_head_dim rotary
query. Head h of a sequence scores its position t as scale · (q_latent[h] · c[t] + q_rope[h] · k_rope[t]) and
returns Σ_t softmax(scores)[t] · c[t], a kv_lora_rank latent. With `selected` = (sel_indptr, sel_positions), a
CSR list of logical positions per sequence (DeepSeek Sparse Attention's top-k), a sequence attends only to
those, each read through the same page table or extent.

Backends as for the other attention calls: "numba" (CPU), "reference" (float64), "cuda-cpu" (the CUDA C
through the CPU shim), "cupy" (GPU). fp8 pools hold e4m3 codes of value / kv_scale.
"""

from __future__ import annotations

import importlib
import math

import numpy as np

from workbench.kernels import validation as v
from workbench.kernels.reference import dequantize, paged_slots

BACKENDS = ("numba", "reference", "cuda-cpu", "cupy")


def paged_mla_decode(q_latent, q_rope, pool, kv_indptr, kv_indices, kv_last_page_len, block_size, backend="numba",
                     kv_dtype=None, scale=None, kv_scale=1.0, selected=None):
    """Latent decode attention over a CSR page table → float32 [num_seqs, num_heads, kv_lora_rank]
    (float64 from "reference"). `scale` defaults to 1/sqrt(kv_lora_rank + qk_rope_head_dim)."""
    return prepare_paged_mla_decode(q_latent, q_rope, pool, kv_indptr, kv_indices, kv_last_page_len, block_size,
                                    backend, kv_dtype, scale, kv_scale, selected)()


def contiguous_mla_decode(q_latent, q_rope, pool, kv_start, kv_len, backend="numba", kv_dtype=None, scale=None,
                          kv_scale=1.0, selected=None):
    """Latent decode attention over contiguous extents (as paged_mla_decode)."""
    return prepare_contiguous_mla_decode(q_latent, q_rope, pool, kv_start, kv_len, backend, kv_dtype, scale, kv_scale,
                                         selected)()


def prepare_paged_mla_decode(q_latent, q_rope, pool, kv_indptr, kv_indices, kv_last_page_len, block_size,
                             backend="numba", kv_dtype=None, scale=None, kv_scale=1.0, selected=None):
    """`paged_mla_decode` checked now; returns the call that runs it (what a timer wraps)."""
    fn = "paged_mla_decode"
    kv_dtype, scale, kv_scale = _check(fn, q_latent, q_rope, pool, kv_dtype, scale, kv_scale)
    kv_len = v.check_paged(fn, q_latent.shape[0], pool.shape[0], kv_indptr, kv_indices, kv_last_page_len, block_size)
    selected = _check_selected(fn, selected, kv_len)
    paged = (kv_indptr, kv_indices, kv_last_page_len, int(block_size))
    return lambda: _run(fn, backend, q_latent, q_rope, pool, kv_dtype, scale, kv_scale, selected, paged=paged)


def prepare_contiguous_mla_decode(q_latent, q_rope, pool, kv_start, kv_len, backend="numba", kv_dtype=None,
                                  scale=None, kv_scale=1.0, selected=None):
    """`contiguous_mla_decode` checked now; returns the call that runs it."""
    fn = "contiguous_mla_decode"
    kv_dtype, scale, kv_scale = _check(fn, q_latent, q_rope, pool, kv_dtype, scale, kv_scale)
    lengths = v.check_contiguous(fn, q_latent.shape[0], pool.shape[0], kv_start, kv_len)
    selected = _check_selected(fn, selected, lengths)
    return lambda: _run(fn, backend, q_latent, q_rope, pool, kv_dtype, scale, kv_scale, selected,
                        contiguous=(kv_start, kv_len))


def mla_bytes_read(num_tokens, latent: int, rope: int, kv_dtype: str) -> int:
    """Pool bytes a latent decode must read: each attended row once (all heads share it)."""
    return int(np.sum(v.host(num_tokens), dtype=np.int64)) * (latent + rope) * v.STORAGE_DTYPE[kv_dtype].itemsize


def _check(fn, q_latent, q_rope, pool, kv_dtype, scale, kv_scale):
    v.check_array(fn, "q_latent", q_latent, np.float32, (None, None, None))
    num_seqs, num_heads, _ = q_latent.shape
    v.check_array(fn, "q_rope", q_rope, np.float32, (num_seqs, num_heads, None))
    v.check_array(fn, "pool", pool, None, (None, None))
    latent, rope = q_latent.shape[2], q_rope.shape[2]
    if latent < 1 or rope < 1 or num_heads < 1:
        v._fail(fn, f"needs num_heads, kv_lora_rank and qk_rope_head_dim >= 1, got q_latent {tuple(q_latent.shape)}, "
                    f"q_rope {tuple(q_rope.shape)}")
    if pool.shape[1] != latent + rope:
        v._fail(fn, f"pool rows must be kv_lora_rank + qk_rope_head_dim = {latent + rope} wide, got {pool.shape[1]}")
    rows = pool.reshape(pool.shape[0], 1, pool.shape[1])  # one latent "head": the per-head pools' checks apply
    kv_dtype = v.check_pools(fn, rows, rows, kv_dtype)
    kv_scale = v.check_kv_scales(fn, kv_dtype, kv_scale, 1.0)[0]
    if scale is None:
        scale = 1.0 / math.sqrt(latent + rope)
    if not (isinstance(scale, int | float | np.floating) and math.isfinite(scale) and scale > 0):
        v._fail(fn, f"scale must be a positive finite float, got {scale!r}")
    return kv_dtype, float(scale), kv_scale


def _check_selected(fn, selected, kv_len):
    """(sel_indptr int32 [num_seqs + 1] from 0, sel_positions int32 [nnz]): every sequence selects >= 1 of its
    own positions [0, kv_len)."""
    if selected is None:
        return None
    sel_indptr, sel_positions = selected
    num_seqs = len(kv_len)
    v.check_array(fn, "sel_indptr", sel_indptr, np.int32, (num_seqs + 1,))
    v.check_array(fn, "sel_positions", sel_positions, np.int32, (None,))
    indptr, positions = v.host(sel_indptr).astype(np.int64), v.host(sel_positions).astype(np.int64)
    counts = np.diff(indptr)
    if indptr[0] != 0 or indptr[-1] != len(positions) or (counts < 1).any():
        v._fail(fn, f"sel_indptr must start at 0, end at len(sel_positions) = {len(positions)} and give every "
                    f"sequence >= 1 position")
    owner = np.repeat(np.arange(num_seqs), counts)
    if len(positions) and ((positions < 0) | (positions >= np.asarray(kv_len, dtype=np.int64)[owner])).any():
        v._fail(fn, "sel_positions must lie in [0, kv_len) of their sequence")
    return sel_indptr, sel_positions


# the modules that run the latent kernel, imported on first use (as workbench.kernels' backends)
BACKEND_MODULES = {"numba": "workbench.kernels.numba_mla", "cuda-cpu": "workbench.kernels.cuda_cpu",
                   "cupy": "workbench.kernels.cupy_backend"}


def _run(fn, backend, q_latent, q_rope, pool, kv_dtype, scale, kv_scale, selected, *, paged=None, contiguous=None):
    kw = dict(paged=paged, contiguous=contiguous, selected=selected)
    if backend == "reference":
        return reference(q_latent, q_rope, pool, kv_dtype, scale, kv_scale, **kw)
    if backend not in BACKEND_MODULES:
        v._fail(fn, f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return importlib.import_module(BACKEND_MODULES[backend]).mla_decode(q_latent, q_rope, pool, kv_dtype, scale,
                                                                         kv_scale, **kw)


def reference(q_latent, q_rope, pool, kv_dtype, scale, kv_scale, *, paged=None, contiguous=None, selected=None):
    """Float64: each sequence's rows gathered by logical position, dequantized, softmax, weighted latent sum."""
    num_seqs, num_heads, latent = q_latent.shape
    out = np.empty((num_seqs, num_heads, latent), dtype=np.float64)
    for seq in range(num_seqs):
        if paged is not None:
            slots = paged_slots(*paged[:3], paged[3], seq)
        else:
            kv_start, kv_len = contiguous
            slots = int(kv_start[seq]) + np.arange(int(kv_len[seq]), dtype=np.int64)
        if selected is not None:
            sel_indptr, sel_positions = selected
            slots = slots[sel_positions[sel_indptr[seq]:sel_indptr[seq + 1]].astype(np.int64)]
        rows = dequantize(pool[slots], kv_dtype, kv_scale)  # [n, latent + rope]
        c, k_rope = rows[:, :latent], rows[:, latent:]
        # einsum, not BLAS: a BLAS product's last bits depend on its thread count
        scores = (np.einsum("hd,nd->hn", np.asarray(q_latent[seq], dtype=np.float64), c)
                  + np.einsum("hd,nd->hn", np.asarray(q_rope[seq], dtype=np.float64), k_rope)) * scale  # [heads, n]
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[seq] = np.einsum("hn,nd->hd", p, c) / p.sum(axis=1, keepdims=True)
    return out
