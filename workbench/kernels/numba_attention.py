"""The Numba attention kernel: decode and causal extend, paged or contiguous, in one routine.

Decode is extend with one query per sequence. A work item is (query chunk, KV partition): it
covers every head, so each slot's K and V rows [num_kv_heads, head_dim] are read once, as one
contiguous run, for all query heads of every GQA group and all queries of the chunk. It keeps
float32 online-softmax state (running max `m`, sum `ell`, accumulator `acc`) per (query, head)
row and writes a normalized partial output plus (m, ell). When a sequence is split into several
KV partitions, `merge_partials` combines them (flash-decoding).

The only difference between paged and contiguous addressing is how a tile's slots are computed
(`tile_slots`); everything after that reads float32 rows.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from workbench.kernels.numba_convert import FP32, bits_to_float, load_row
from workbench.kernels.numba_tiles import FASTMATH, tile_accumulate, tile_scores

TILE_TOKENS = 32  # tokens per online-softmax step: scores [rows, TILE_TOKENS] stay in L1
NEG_INF = np.float32(-np.inf)
_LOG2E = np.float32(1.4426950408889634)
_LN2_HI = np.float32(0.693359375)  # Cody-Waite split of ln 2: n * _LN2_HI is exact for |n| < 2^10
_LN2_LO = np.float32(-2.12194440e-4)
_EXP_UNDERFLOW = np.float32(-87.0)  # below this e^x is under float32's smallest normal: return 0


@njit(inline="always", cache=True, fastmath=FASTMATH)
def exp_nonpositive(x):
    """e^x for float32 x <= 0 (or -inf → 0, NaN → NaN), within ~2 ulp.

    Plain arithmetic plus a bit cast (Cephes expf polynomial), so loops over it vectorize; Numba's
    np.exp is a scalar libm call per element. Softmax only ever exponentiates x - max(x) <= 0.
    """
    n = np.floor(x * _LOG2E + np.float32(0.5))
    r = x - n * _LN2_HI - n * _LN2_LO  # |r| <= ln2 / 2
    poly = np.float32(1.9875691500e-4)
    poly = poly * r + np.float32(1.3981999507e-3)
    poly = poly * r + np.float32(8.3334519073e-3)
    poly = poly * r + np.float32(4.1665795894e-2)
    poly = poly * r + np.float32(1.6666665459e-1)
    poly = poly * r + np.float32(5.0000001201e-1)
    poly = poly * r * r + r + np.float32(1.0)
    # 2^n built from its exponent bits; n in -126..0 here (clamped so NaN/underflow lanes stay defined)
    two_n = bits_to_float((np.int32(max(n, np.float32(-126.0))) + np.int32(127)) << np.int32(23))
    result = poly * two_n
    return np.float32(0.0) if x < _EXP_UNDERFLOW else result


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


@njit(nogil=True, cache=True, fastmath=FASTMATH)
def attend_items(q, qo_indptr, pools, num_kv_heads, kv_code, paged, table, block_size, scale, window, chunks,
                 part_tokens, parts, first_item, item_stride):
    """Run work items first_item, first_item + item_stride, ... of every (query chunk, KV partition) item;
    fills their share of parts = (part_out [num_parts, total_q, num_heads, head_dim], part_m, part_l
    [num_parts, total_q, num_heads]) and mutates nothing else. Releases the GIL: threads given different
    `first_item` with the same stride run side by side (numba_backend.py).

    pools = (k_rows, v_rows, k_bits, v_bits): fp32 pools as float32 [num_slots * num_kv_heads, head_dim]
    rows, 16-bit pools as uint16 [num_slots, num_kv_heads, head_dim]; the unused pair is a
    placeholder, so one compiled kernel serves every KV dtype. table = (kv_indptr, kv_indices,
    kv_start, kv_len); chunks = (chunk_seq, chunk_q_begin, chunk_q_end). Partition p of a sequence
    covers positions p*part_tokens .. (p+1)*part_tokens-1. window > 0: a query at position p reads
    only positions p − window + 1 .. p (0: every position up to p).

    `attend_item` is inlined, so this function is the kernel's only compiled copy. (A prange body calling a
    separately compiled function links a second copy into its own module, optimized again there; a process
    then runs whichever copy it loaded first, and under fastmath the two can round differently. Inlined
    into a prange body instead, the inner loops do not vectorize.)
    """
    num_parts = parts[0].shape[0]
    for item in range(first_item, chunks[0].shape[0] * num_parts, item_stride):
        chunk, part = item // num_parts, item % num_parts
        attend_item(q, qo_indptr, pools, num_kv_heads, kv_code, paged, table, block_size, scale, window,
                    chunks[0][chunk], chunks[1][chunk], chunks[2][chunk], part, part_tokens, parts)


@njit(inline="always", cache=True, fastmath=FASTMATH)
def attend_item(q, qo_indptr, pools, num_kv_heads, kv_code, paged, table, block_size, scale, window, seq, q_begin,
                q_end, part, part_tokens, parts):
    """Queries q_begin..q_end-1 of `seq`, all heads, over one KV partition. Mutates parts only.

    All heads at once so that each slot's K (and V) row [num_kv_heads, head_dim] is read as one
    contiguous run: per-head items would stride through the pool and defeat the prefetcher.
    State rows r = (query, head), query-major; row r reads kv head (r % num_heads) // group.
    """
    k_rows, v_rows, k_bits, v_bits = pools
    kv_indptr, kv_indices, kv_start, kv_len = table
    part_out, part_m, part_l = parts
    num_heads, head_dim = q.shape[1], q.shape[2]
    group = num_heads // num_kv_heads
    seq_len = np.int64(kv_len[seq])
    first_q_pos = seq_len - (qo_indptr[seq + 1] - qo_indptr[seq])  # position of the sequence's first query
    pos_begin = np.int64(part) * part_tokens
    if pos_begin >= seq_len:
        return  # this sequence has fewer partitions; merge never reads this one
    # the chunk's last query (q_end - 1) sees positions up to first_q_pos + (q_end - 1 - qo_indptr[seq])
    pos_end = min(pos_begin + part_tokens, first_q_pos + (q_end - qo_indptr[seq]))
    num_rows = (q_end - q_begin) * num_heads
    qs = np.empty((num_rows, head_dim), dtype=np.float32)  # scaled queries
    row_limit = np.empty(num_rows, dtype=np.int64)  # last visible position per row
    row_kv_head = np.empty(num_rows, dtype=np.int64)
    for r in range(num_rows):
        qi, h = q_begin + r // num_heads, r % num_heads
        row_limit[r] = first_q_pos + (qi - qo_indptr[seq])
        row_kv_head[r] = h // group
        for d in range(head_dim):
            qs[r, d] = q[qi, h, d] * scale
    acc = np.zeros((num_rows, head_dim), dtype=np.float32)
    m = np.full(num_rows, NEG_INF, dtype=np.float32)
    ell = np.zeros(num_rows, dtype=np.float32)
    slots = np.empty(TILE_TOKENS, dtype=np.int64)
    rows = np.empty(TILE_TOKENS, dtype=np.int64)  # first row (kv head 0) of each tile token in k_src / v_src
    tile_rows = TILE_TOKENS * num_kv_heads if kv_code != FP32 else 1
    k_tile = np.empty((tile_rows, head_dim), dtype=np.float32)  # decoded 16-bit rows [token * kv head, D]
    v_tile = np.empty((tile_rows, head_dim), dtype=np.float32)
    scores = np.empty((num_rows, TILE_TOKENS), dtype=np.float32)
    min_limit = row_limit[0]
    max_first = 0  # positions below this are out of some row's window (0: no window)
    if window > 0:  # the chunk's first row sees the earliest window; nothing before it is read
        pos_begin = max(pos_begin, min_limit - window + 1)
        max_first = row_limit[num_rows - 1] - window + 1
    for pos0 in range(pos_begin, pos_end, TILE_TOKENS):
        n = min(TILE_TOKENS, pos_end - pos0)
        tile_slots(paged, seq, pos0, n, kv_indptr, kv_indices, block_size, kv_start, slots)
        if kv_code == FP32:  # read the pool in place
            k_src, v_src = k_rows, v_rows
            for t in range(n):
                rows[t] = slots[t] * num_kv_heads
        else:
            k_src, v_src = k_tile, v_tile
            # the tile's two halves decoded in alternation, row by row: four sequential read streams
            # (K and V of each half) instead of two, so the loads of one half's scattered block overlap
            # the other's (churned paged tables, 16-bit KV: ~1.14 -> ~1.08 x contiguous; docs/performance.md)
            half = (n + 1) // 2
            for t in range(n):
                rows[t] = t * num_kv_heads
            for a in range(half):
                b = a + half
                for h in range(num_kv_heads):
                    load_row(k_bits, slots[a], h, kv_code, k_tile, rows[a] + h)
                    load_row(v_bits, slots[a], h, kv_code, v_tile, rows[a] + h)
                    if b < n:
                        load_row(k_bits, slots[b], h, kv_code, k_tile, rows[b] + h)
                        load_row(v_bits, slots[b], h, kv_code, v_tile, rows[b] + h)
        tile_scores(qs, k_src, rows, row_kv_head, n, scores)
        if pos0 + n - 1 > min_limit:  # causal mask only where some row cannot see the whole tile
            for r in range(num_rows):
                for t in range(n):
                    if pos0 + t > row_limit[r]:
                        scores[r, t] = NEG_INF
        if pos0 < max_first:  # window mask only where some row's window starts inside the tile
            for r in range(num_rows):
                for t in range(n):
                    if pos0 + t <= row_limit[r] - window:
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
                alpha = exp_nonpositive(m[r] - new_m)
                ell[r] *= alpha
                for d in range(head_dim):
                    acc[r, d] *= alpha
                m[r] = new_m
            row_sum = np.float32(0.0)
            for t in range(n):
                p = exp_nonpositive(scores[r, t] - new_m)
                scores[r, t] = p
                row_sum += p
            ell[r] += row_sum
        tile_accumulate(acc, v_src, rows, row_kv_head, n, scores)
    for r in range(num_rows):
        qi, h = q_begin + r // num_heads, r % num_heads
        part_m[part, qi, h] = m[r]
        part_l[part, qi, h] = ell[r]
        # ell == 0 only when the whole partition is past this row's causal limit or before its window; a NaN
        # must propagate
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
