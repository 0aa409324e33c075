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
def _schedule(n):
    """NumPy's pairwise tree over n values as a schedule: the leaves' lengths, left to right (uint8 [k]), and
    how many subtrees end with each leaf (uint8 [k]): after leaf j, that many times the last two partial
    sums are replaced by their sum (left + right), which is the tree's own order of additions."""
    bound = max(1, 2 * (n // (PAIRWISE_BLOCK // 2)) + 2)  # leaves are longer than PAIRWISE_BLOCK / 2 - 8
    sizes = np.zeros(bound, dtype=np.uint8)
    merges = np.zeros(bound, dtype=np.uint8)
    lengths = np.empty(128, dtype=np.int64)  # the walk's stack: a subtree's length and how far it got
    states = np.empty(128, dtype=np.int64)  # 0: not split yet, 1: left half done, 2: both halves done
    lengths[0] = n
    states[0] = 0
    top = 1
    k = 0
    while top:
        m = lengths[top - 1]
        if m <= PAIRWISE_BLOCK:
            sizes[k] = m
            k += 1
            top -= 1
            continue
        half = m // 2
        half -= half % UNROLL
        state = states[top - 1]
        states[top - 1] = state + 1
        if state == 0:
            lengths[top] = half
        elif state == 1:
            lengths[top] = m - half
        else:
            merges[k - 1] += 1  # this subtree's sum = left + right, right after its last leaf
            top -= 1
            continue
        states[top] = 0
        top += 1
    return sizes[:k], merges[:k]


_SCHEDULES: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # n -> schedule, shared by sums of equal length


def _schedule_of(n: int) -> tuple[np.ndarray, np.ndarray]:
    if n not in _SCHEDULES:
        if len(_SCHEDULES) > 64:
            _SCHEDULES.clear()
        _SCHEDULES[n] = _schedule(n)
    return _SCHEDULES[n]


@njit(cache=True)
def _feed(x, sizes, merges, leaf, partials, depth):
    """Sum the leaves sizes[leaf:] that x holds whole and fold them into `partials[:depth]` as the schedule
    says; returns (leaves done, values used, depth)."""
    at = 0
    k = leaf
    while k < sizes.shape[0] and at + sizes[k] <= x.shape[0]:
        partials[depth] = _leaf_sum(x, at, sizes[k])
        depth += 1
        for _ in range(merges[k]):
            partials[depth - 2] = partials[depth - 2] + partials[depth - 1]
            depth -= 1
        at += sizes[k]
        k += 1
    return k - leaf, at, depth


class PairwiseSum:
    """`np.sum` of a float64 sequence of known length `n`, fed in order by `add` (any chunking), holding
    one partial sum per level of the tree. `add` mutates; `total` once every value was added."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._sizes, self._merges = _schedule_of(n) if n else (np.zeros(0, np.uint8), np.zeros(0, np.uint8))
        self._partials = np.zeros(128, dtype=np.float64)
        self._depth = 0
        self._leaf = 0  # leaves summed
        self._carry = np.zeros(0, dtype=np.float64)  # values of the next leaf seen so far
        self._seen = 0

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64)
        self._seen += values.shape[0]
        x = np.concatenate([self._carry, values]) if self._carry.shape[0] else np.ascontiguousarray(values)
        done, used, self._depth = _feed(x, self._sizes, self._merges, self._leaf, self._partials, self._depth)
        self._leaf += done
        self._carry = x[used:].copy()

    def total(self) -> float:
        if self._seen != self.n:
            raise ValueError(f"PairwiseSum of {self.n} values was given {self._seen}")
        if not self.n:
            return 0.0
        return float(self._partials[0])


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
