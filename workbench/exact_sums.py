"""NumPy's float64 sums reproduced bit for bit over a sequence that arrives in chunks.

A run's summary is computed from its step and request tables, which stream to disk while the run goes
(docs/outputs.md); it must equal, to the last bit, what NumPy computes over the whole columns. NumPy
sums a contiguous float64 array by a pairwise tree whose shape depends on the length (`np.add.reduce`:
a run of at most 128 values is summed with eight interleaved accumulators; a longer one is split at
half its length, rounded down to a multiple of 8, and the halves' sums are added). So a sum over a
column is `PairwiseSum(length)` fed the column in chunks: it cuts the same leaves, sums each the way
NumPy does, and adds them up the same tree. A sum that casts (the mean of an integer or boolean column)
goes through NumPy's buffer instead: `np.getbufsize()` values at a time, each buffer summed pairwise and
added in order (`BufferedSum`).

Both are checked against `np.sum` on random data of many lengths (tests/test_exact_sums.py); a NumPy
that changed its summation order would fail there, not silently change a summary.
"""

from __future__ import annotations

import numpy as np
from numba import njit

PAIRWISE_BLOCK = 128  # NumPy's PW_BLOCKSIZE: runs up to this length are summed in one leaf
UNROLL = 8  # interleaved accumulators of a leaf; splits fall on multiples of this


@njit(cache=True)
def _leaf_sum(x, start, n):
    """NumPy's pairwise_sum on x[start:start + n] for n <= PAIRWISE_BLOCK."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += x[start + i]
        return res
    r0, r1, r2, r3 = x[start], x[start + 1], x[start + 2], x[start + 3]
    r4, r5, r6, r7 = x[start + 4], x[start + 5], x[start + 6], x[start + 7]
    i = 8
    stop = n - n % 8
    while i < stop:
        r0 += x[start + i]
        r1 += x[start + i + 1]
        r2 += x[start + i + 2]
        r3 += x[start + i + 3]
        r4 += x[start + i + 4]
        r5 += x[start + i + 5]
        r6 += x[start + i + 6]
        r7 += x[start + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += x[start + i]
        i += 1
    return res


@njit(cache=True)
def _leaf_sizes(n):
    """The lengths of the leaves of NumPy's pairwise tree over n values, left to right, int64."""
    out = np.empty(max(1, 2 * (n // (PAIRWISE_BLOCK // 2)) + 2), dtype=np.int64)
    stack = np.empty(128, dtype=np.int64)
    stack[0] = n
    top = 1
    k = 0
    while top:
        top -= 1
        m = stack[top]
        if m <= PAIRWISE_BLOCK:
            out[k] = m
            k += 1
            continue
        half = m // 2
        half -= half % 8
        stack[top] = m - half  # the right half is visited after the left
        stack[top + 1] = half
        top += 2
    return out[:k]


@njit(cache=True)
def _sum_leaves(x, sizes, first, sums):
    """Sums of consecutive leaves of x (sizes[first:]) while x holds them whole; returns (leaves summed,
    values used)."""
    at = 0
    k = first
    while k < sizes.shape[0] and at + sizes[k] <= x.shape[0]:
        sums[k] = _leaf_sum(x, at, sizes[k])
        at += sizes[k]
        k += 1
    return k - first, at


@njit(cache=True)
def _combine(n, sums):
    """The tree's total from its leaf sums, in NumPy's order (left subtree + right subtree)."""
    # post-order walk with an explicit stack of (length, state); values pushed as subtrees finish
    lengths = np.empty(128, dtype=np.int64)
    states = np.empty(128, dtype=np.int64)  # 0: not yet split, 1: left done, 2: both done
    values = np.empty(128, dtype=np.float64)
    nv = 0
    lengths[0] = n
    states[0] = 0
    top = 1
    leaf = 0
    while top:
        m = lengths[top - 1]
        if m <= PAIRWISE_BLOCK:
            values[nv] = sums[leaf]
            nv += 1
            leaf += 1
            top -= 1
            continue
        half = m // 2
        half -= half % 8
        state = states[top - 1]
        if state == 0:
            states[top - 1] = 1
            lengths[top] = half
            states[top] = 0
            top += 1
        elif state == 1:
            states[top - 1] = 2
            lengths[top] = m - half
            states[top] = 0
            top += 1
        else:
            values[nv - 2] = values[nv - 2] + values[nv - 1]
            nv -= 1
            top -= 1
    return values[0]


class PairwiseSum:
    """`np.sum` of a float64 sequence of known length `n`, fed in order by `add` (any chunking).
    `add` mutates; `total` once every value was added."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._sizes = _leaf_sizes(n) if n else np.zeros(0, dtype=np.int64)
        self._sums = np.zeros(self._sizes.shape[0], dtype=np.float64)
        self._done = 0  # leaves summed
        self._carry = np.zeros(0, dtype=np.float64)  # values of the next leaf seen so far
        self._seen = 0

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64)
        self._seen += values.shape[0]
        x = np.concatenate([self._carry, values]) if self._carry.shape[0] else np.ascontiguousarray(values)
        done, used = _sum_leaves(x, self._sizes, self._done, self._sums)
        self._done += done
        self._carry = x[used:].copy()

    def total(self) -> float:
        if self._seen != self.n:
            raise ValueError(f"PairwiseSum of {self.n} values was given {self._seen}")
        if not self.n:
            return 0.0
        return float(_combine(self.n, self._sums))


class BufferedSum:
    """`np.add.reduce` of a sequence cast to float64 on the way (an integer or boolean column's mean):
    NumPy casts `np.getbufsize()` values at a time, sums each buffer pairwise and adds the buffers in
    order. `add` mutates."""

    def __init__(self) -> None:
        self._size = np.getbufsize()
        self._carry = np.zeros(0, dtype=np.float64)
        self._total = 0.0
        self.count = 0

    def add(self, values: np.ndarray) -> None:
        self.count += values.shape[0]
        x = np.concatenate([self._carry, values.astype(np.float64)])
        full = x.shape[0] - x.shape[0] % self._size
        for start in range(0, full, self._size):
            self._total += float(np.sum(x[start:start + self._size]))
        self._carry = x[full:]

    def total(self) -> float:
        return self._total + float(np.sum(self._carry)) if self._carry.shape[0] else self._total
