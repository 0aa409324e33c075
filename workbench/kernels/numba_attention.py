"""The Numba attention kernel: decode and causal extend, paged or contiguous, in one routine.

Decode is extend with one query per sequence. A work item is (query chunk, KV partition, kv head):
it reads each K/V row of its partition once for all the query heads of its GQA group and all the
queries of its chunk, keeps float32 online-softmax state (running max `m`, sum `l`, accumulator
`acc`) per query row, and writes a normalized partial output plus (m, l). When a sequence is split
into several KV partitions, `merge_partials` combines them (flash-decoding).

The only difference between paged and contiguous addressing is how a tile's slots are computed
(`tile_slots`); everything after that reads float32 tiles.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from workbench.kernels.numba_convert import load_row

TILE_TOKENS = 32  # K/V rows gathered per step: scores [rows, TILE_TOKENS] stay in L1
# Reassociation lets the head_dim reductions vectorize; NaN/inf flags stay off because -inf is the
# empty-softmax marker and a NaN in the pool must surface, not be optimized away.
FASTMATH = {"reassoc", "contract", "nsz", "arcp"}
NEG_INF = np.float32(-np.inf)


@njit(inline="always", cache=True)
def tile_slots(paged, seq, pos0, num_tokens, kv_indptr, kv_indices, block_size, kv_start, slots):
    """slots[:num_tokens] = pool slots of logical positions pos0.. of `seq`. Mutates slots only."""
    if paged:
        first = kv_indptr[seq]
        for t in range(num_tokens):
            pos = pos0 + t
            slots[t] = np.int64(kv_indices[first + pos // block_size]) * block_size + pos % block_size
    else:
        for t in range(num_tokens):
            slots[t] = np.int64(kv_start[seq]) + pos0 + t


@njit(parallel=True, cache=True, fastmath=FASTMATH)
def attention_partials(q, qo_indptr, k_pool, v_pool, kv_code, paged, kv_indptr, kv_indices, block_size,
                       kv_start, kv_len, scale, chunk_seq, chunk_q_begin, chunk_q_end, part_tokens,
                       part_out, part_m, part_l):
    """Fill part_out [num_parts, total_q, num_heads, head_dim], part_m/part_l [num_parts, total_q, num_heads].

    Mutates only the three part_* arrays; partition p of a sequence covers positions
    p*part_tokens .. (p+1)*part_tokens-1. Partitions past a query's causal limit get m=-inf, l=0.
    """
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_pool.shape[1]
    group = num_heads // num_kv_heads
    num_parts = part_out.shape[0]
    num_chunks = chunk_seq.shape[0]
    for item in prange(num_chunks * num_parts * num_kv_heads):
        kv_head = item % num_kv_heads
        part = (item // num_kv_heads) % num_parts
        chunk = item // (num_kv_heads * num_parts)
        seq = chunk_seq[chunk]
        q_begin, q_end = chunk_q_begin[chunk], chunk_q_end[chunk]
        seq_len = np.int64(kv_len[seq])
        first_q_pos = seq_len - (qo_indptr[seq + 1] - qo_indptr[seq])  # position of the sequence's first query
        pos_begin = np.int64(part) * part_tokens
        if pos_begin >= seq_len:
            continue  # this sequence has fewer partitions; merge never reads this one
        # the chunk's last query sees up to first_q_pos + (q_end - 1 - qo_indptr[seq])
        pos_end = min(pos_begin + part_tokens, first_q_pos + (q_end - qo_indptr[seq]))
        num_rows = (q_end - q_begin) * group
        qs = np.empty((num_rows, head_dim), dtype=np.float32)  # scaled queries, row = (query, head in group)
        row_limit = np.empty(num_rows, dtype=np.int64)  # last visible position per row
        for r in range(num_rows):
            qi = q_begin + r // group
            h = kv_head * group + r % group
            row_limit[r] = first_q_pos + (qi - qo_indptr[seq])
            for d in range(head_dim):
                qs[r, d] = q[qi, h, d] * scale
        acc = np.zeros((num_rows, head_dim), dtype=np.float32)
        m = np.full(num_rows, NEG_INF, dtype=np.float32)
        ell = np.zeros(num_rows, dtype=np.float32)
        slots = np.empty(TILE_TOKENS, dtype=np.int64)
        k_tile = np.empty((TILE_TOKENS, head_dim), dtype=np.float32)
        v_tile = np.empty((TILE_TOKENS, head_dim), dtype=np.float32)
        scores = np.empty((num_rows, TILE_TOKENS), dtype=np.float32)
        min_limit = row_limit[0]
        for pos0 in range(pos_begin, pos_end, TILE_TOKENS):
            n = min(TILE_TOKENS, pos_end - pos0)
            tile_slots(paged, seq, pos0, n, kv_indptr, kv_indices, block_size, kv_start, slots)
            for t in range(n):
                load_row(k_pool, slots[t], kv_head, kv_code, k_tile, t)
                load_row(v_pool, slots[t], kv_head, kv_code, v_tile, t)
            for r in range(num_rows):
                for t in range(n):
                    dot = np.float32(0.0)
                    for d in range(head_dim):
                        dot += qs[r, d] * k_tile[t, d]
                    scores[r, t] = dot
            if pos0 + n - 1 > min_limit:  # causal mask only where some row cannot see the whole tile
                for r in range(num_rows):
                    for t in range(n):
                        if pos0 + t > row_limit[r]:
                            scores[r, t] = NEG_INF
            for r in range(num_rows):
                tile_max = NEG_INF
                for t in range(n):
                    tile_max = max(tile_max, scores[r, t])
                new_m = max(m[r], tile_max)
                if new_m == NEG_INF:  # every position so far is masked for this row
                    for t in range(n):
                        scores[r, t] = np.float32(0.0)
                    continue
                if new_m > m[r]:
                    alpha = np.exp(m[r] - new_m)
                    ell[r] *= alpha
                    for d in range(head_dim):
                        acc[r, d] *= alpha
                    m[r] = new_m
                for t in range(n):
                    p = np.exp(scores[r, t] - new_m)
                    scores[r, t] = p
                    ell[r] += p
            for r in range(num_rows):
                for t in range(n):
                    p = scores[r, t]
                    for d in range(head_dim):
                        acc[r, d] += p * v_tile[t, d]
        for r in range(num_rows):
            qi = q_begin + r // group
            h = kv_head * group + r % group
            part_m[part, qi, h] = m[r]
            part_l[part, qi, h] = ell[r]
            # ell == 0 only when the whole partition is past this row's causal limit; a NaN must propagate
            inv = np.float32(1.0) / ell[r] if ell[r] != 0 else np.float32(0.0)
            for d in range(head_dim):
                part_out[part, qi, h, d] = acc[r, d] * inv


@njit(parallel=True, cache=True)
def merge_partials(qo_indptr, kv_len, part_tokens, part_out, part_m, part_l, out):
    """out [total_q, num_heads, head_dim] = softmax-weighted sum of each query's partitions. Mutates out."""
    num_seqs = qo_indptr.shape[0] - 1
    num_heads, head_dim = out.shape[1], out.shape[2]
    for seq in prange(num_seqs):
        num_parts = (np.int64(kv_len[seq]) + part_tokens - 1) // part_tokens
        for qi in range(qo_indptr[seq], qo_indptr[seq + 1]):
            for h in range(num_heads):
                top = NEG_INF
                for p in range(num_parts):
                    top = max(top, part_m[p, qi, h])
                total = np.float32(0.0)
                for d in range(head_dim):
                    out[qi, h, d] = np.float32(0.0)
                for p in range(num_parts):
                    if part_l[p, qi, h] != 0:  # empty partitions carry no weight; NaN propagates
                        weight = part_l[p, qi, h] * np.exp(part_m[p, qi, h] - top)
                        total += weight
                        for d in range(head_dim):
                            out[qi, h, d] += weight * part_out[p, qi, h, d]
                for d in range(head_dim):
                    out[qi, h, d] /= total
