"""The two inner products of the Numba attention kernel over one tile of up to TILE_TOKENS tokens.

Register blocking: each pass over head_dim serves two query rows (when they read the same kv head,
as neighbours in a GQA group do) and four tokens, so one load of a K or V row feeds two
multiply-adds and one load of a query or accumulator row feeds four. Measured on this machine's
AVX-512 cores that is ~1.6x the one-row, one-token form.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Reassociation lets the head_dim reductions vectorize; NaN/inf flags stay off because -inf is the
# empty-softmax marker and a NaN in the pool must surface, not be optimized away.
FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


@njit(inline="always", cache=True, fastmath=FASTMATH)
def tile_scores(qs, k_src, rows, row_kv_head, n, scores):
    """scores[r, t] = qs[r] · k_src[rows[t] + row_kv_head[r]] for every row r and t < n. Mutates scores.

    qs [num_rows, head_dim]; k_src [*, head_dim]; rows [>= n]; scores [num_rows, >= n].
    """
    num_rows = qs.shape[0]
    r = 0
    while r < num_rows:
        if r + 1 < num_rows and row_kv_head[r + 1] == row_kv_head[r]:
            _scores_pair(qs, r, k_src, rows, row_kv_head[r], n, scores)
            r += 2
        else:
            _scores_row(qs, r, k_src, rows, row_kv_head[r], 0, n, scores)
            r += 1


@njit(inline="always", cache=True, fastmath=FASTMATH)
def _scores_row(qs, r, k_src, rows, kv_head, t_begin, n, scores):
    q = qs[r]
    for t in range(t_begin, n):
        k = k_src[rows[t] + kv_head]
        s = np.float32(0.0)
        for d in range(q.shape[0]):
            s += q[d] * k[d]
        scores[r, t] = s


@njit(inline="always", cache=True, fastmath=FASTMATH)
def _scores_pair(qs, r, k_src, rows, kv_head, n, scores):
    qa, qb = qs[r], qs[r + 1]
    quad_end = n - n % 4
    for t in range(0, quad_end, 4):
        k0, k1 = k_src[rows[t] + kv_head], k_src[rows[t + 1] + kv_head]
        k2, k3 = k_src[rows[t + 2] + kv_head], k_src[rows[t + 3] + kv_head]
        a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = np.float32(0.0)
        for d in range(qa.shape[0]):
            x, y = qa[d], qb[d]
            c0, c1, c2, c3 = k0[d], k1[d], k2[d], k3[d]
            a0 += x * c0
            a1 += x * c1
            a2 += x * c2
            a3 += x * c3
            b0 += y * c0
            b1 += y * c1
            b2 += y * c2
            b3 += y * c3
        scores[r, t], scores[r, t + 1], scores[r, t + 2], scores[r, t + 3] = a0, a1, a2, a3
        scores[r + 1, t], scores[r + 1, t + 1], scores[r + 1, t + 2], scores[r + 1, t + 3] = b0, b1, b2, b3
    _scores_row(qs, r, k_src, rows, kv_head, quad_end, n, scores)
    _scores_row(qs, r + 1, k_src, rows, kv_head, quad_end, n, scores)


@njit(inline="always", cache=True, fastmath=FASTMATH)
def tile_accumulate(acc, v_src, rows, row_kv_head, n, weights):
    """acc[r] += Σ_{t<n} weights[r, t] · v_src[rows[t] + row_kv_head[r]] for every row r. Mutates acc."""
    num_rows = acc.shape[0]
    r = 0
    while r < num_rows:
        if r + 1 < num_rows and row_kv_head[r + 1] == row_kv_head[r]:
            _accumulate_pair(acc, r, v_src, rows, row_kv_head[r], n, weights)
            r += 2
        else:
            _accumulate_row(acc, r, v_src, rows, row_kv_head[r], 0, n, weights)
            r += 1


@njit(inline="always", cache=True, fastmath=FASTMATH)
def _accumulate_row(acc, r, v_src, rows, kv_head, t_begin, n, weights):
    a = acc[r]
    for t in range(t_begin, n):
        v = v_src[rows[t] + kv_head]
        w = weights[r, t]
        for d in range(a.shape[0]):
            a[d] += w * v[d]


@njit(inline="always", cache=True, fastmath=FASTMATH)
def _accumulate_pair(acc, r, v_src, rows, kv_head, n, weights):
    a, b = acc[r], acc[r + 1]
    quad_end = n - n % 4
    for t in range(0, quad_end, 4):
        v0, v1 = v_src[rows[t] + kv_head], v_src[rows[t + 1] + kv_head]
        v2, v3 = v_src[rows[t + 2] + kv_head], v_src[rows[t + 3] + kv_head]
        wa0, wa1, wa2, wa3 = weights[r, t], weights[r, t + 1], weights[r, t + 2], weights[r, t + 3]
        wb0, wb1, wb2, wb3 = weights[r + 1, t], weights[r + 1, t + 1], weights[r + 1, t + 2], weights[r + 1, t + 3]
        for d in range(a.shape[0]):
            c0, c1, c2, c3 = v0[d], v1[d], v2[d], v3[d]
            a[d] += wa0 * c0 + wa1 * c1 + wa2 * c2 + wa3 * c3
            b[d] += wb0 * c0 + wb1 * c1 + wb2 * c2 + wb3 * c3
    _accumulate_row(acc, r, v_src, rows, kv_head, quad_end, n, weights)
    _accumulate_row(acc, r + 1, v_src, rows, kv_head, quad_end, n, weights)
