"""The Numba twin of the latent attention kernel (kernels/mla_attention.cu): absorbed MLA decode over a
latent pool, paged or contiguous, dense or over selected positions (docs/kernels.md).

One sequence per parallel item: each of its rows is decoded to float32 once and serves every head, whose
running max, sum and LATENT-wide accumulator are updated token by token (online softmax). 16- and 8-bit
rows decode through a table of all their codes' float32 values (exact); fp32 rows through their bits.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from numba import njit, prange

from workbench.kernels.fp8 import E4M3_VALUES
from workbench.kernels.numba_convert import bits_to_float


@cache
def decode_table(kv_dtype: str) -> np.ndarray:
    """float32 value of every code of a 16- or 8-bit KV dtype (empty for fp32, decoded from its bits)."""
    codes16 = np.arange(1 << 16, dtype=np.uint32)
    if kv_dtype == "fp16":
        return codes16.astype(np.uint16).view(np.float16).astype(np.float32)
    if kv_dtype == "bf16":
        return (codes16 << 16).view(np.float32)
    if kv_dtype == "fp8":
        return E4M3_VALUES.astype(np.float32)
    return np.zeros(0, dtype=np.float32)


@njit(parallel=True, cache=True)
def mla_decode_rows(q_latent, q_rope, pool, table, paged, kv_indptr, kv_indices, block_size, kv_start, kv_len,
                    sparse, sel_indptr, sel_positions, scale, kv_scale, out):
    """out[s, h] = Σ_t p[h, t] c[t] with p the softmax over the sequence's positions of scale · (q_lat · c +
    q_rope · k_rope); `pool` is the storage viewed as unsigned codes (fp32 as uint32 bits, `table` empty)."""
    num_seqs, num_heads, latent = q_latent.shape
    rope = q_rope.shape[2]
    for seq in prange(num_seqs):
        count = sel_indptr[seq + 1] - sel_indptr[seq] if sparse else kv_len[seq]
        row = np.empty(latent + rope, dtype=np.float32)
        acc = np.zeros((num_heads, latent), dtype=np.float32)
        m = np.full(num_heads, -np.inf, dtype=np.float32)
        l_sum = np.zeros(num_heads, dtype=np.float32)
        for i in range(count):
            pos = sel_positions[sel_indptr[seq] + i] if sparse else i
            if paged:
                slot = kv_indices[kv_indptr[seq] + pos // block_size] * block_size + pos % block_size
            else:
                slot = kv_start[seq] + pos
            for d in range(latent + rope):
                code = pool[slot, d]
                row[d] = (bits_to_float(code) if table.shape[0] == 0 else table[code]) * np.float32(kv_scale)
            for h in range(num_heads):
                s = np.float32(0.0)
                for d in range(latent):
                    s += q_latent[seq, h, d] * row[d]
                for d in range(rope):
                    s += q_rope[seq, h, d] * row[latent + d]
                s *= np.float32(scale)
                m_new = max(m[h], s)
                alpha = np.float32(np.exp(m[h] - m_new)) if m[h] != -np.inf else np.float32(0.0)
                p = np.float32(np.exp(s - m_new))
                l_sum[h] = l_sum[h] * alpha + p
                m[h] = m_new
                for d in range(latent):
                    acc[h, d] = acc[h, d] * alpha + p * row[d]
        for h in range(num_heads):
            for d in range(latent):
                out[seq, h, d] = acc[h, d] / l_sum[h]


def mla_decode(q_latent, q_rope, pool, kv_dtype, scale, kv_scale, *, paged=None, contiguous=None, selected=None):
    """float32 [num_seqs, H, kv_lora_rank]; arguments as `workbench.kernels.mla`'s, validated."""
    codes = pool.view({"fp32": np.uint32, "fp16": np.uint16}.get(kv_dtype, pool.dtype))
    empty = np.zeros(1, dtype=np.int32)
    if paged is not None:
        kv_indptr, kv_indices, kv_last_page_len, block_size = paged
        kv_start, kv_len = empty, ((np.diff(kv_indptr) - 1) * block_size + kv_last_page_len).astype(np.int32)
    else:
        kv_start, kv_len = contiguous
        kv_indptr, kv_indices, block_size = empty, empty, 1
    sel_indptr, sel_positions = selected if selected is not None else (empty, empty)
    out = np.empty(q_latent.shape, dtype=np.float32)
    mla_decode_rows(q_latent, q_rope, codes, decode_table(kv_dtype), paged is not None, kv_indptr, kv_indices,
                    int(block_size), kv_start, kv_len, selected is not None, sel_indptr, sel_positions, float(scale),
                    float(kv_scale), out)
    return out
