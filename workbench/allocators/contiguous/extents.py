"""Placement of contiguous extents in one linear slot space: first fit, best fit, buddy.

A placer owns the free space only; the strategy remembers which extent belongs to which sequence.
`place` returns the (start, allocated size) of a new extent or None, changing nothing on refusal;
`release` gives an extent back and coalesces. The free space always has one canonical form (maximal
free runs; for buddy, maximal free buddy blocks), so releasing what was just placed restores the
exact previous state, which makes all-or-nothing placement of a group a place-then-roll-back.
"""

from __future__ import annotations

import bisect

import numpy as np


class RunPlacer:
    """First fit (lowest address) or best fit (smallest run that fits, then lowest address) over a
    sorted list of maximal free runs. O(number of free runs) per operation, vectorized."""

    def __init__(self, capacity_slots: int, best: bool) -> None:
        self.best = best
        self.capacity_slots = capacity_slots
        self._starts = np.array([0], dtype=np.int64)  # [num_runs] sorted, runs never touch
        self._sizes = np.array([capacity_slots], dtype=np.int64)  # [num_runs]
        self.free_slots = capacity_slots

    def alloc_size(self, size: int) -> int:
        return size

    def place(self, size: int) -> tuple[int, int] | None:
        """Mutates on success."""
        fits = self._sizes >= size
        if not fits.any():
            return None
        i = int(np.argmin(np.where(fits, self._sizes, np.iinfo(np.int64).max))) if self.best else int(np.argmax(fits))
        start = int(self._starts[i])
        if self._sizes[i] == size:
            self._starts = _without(self._starts, i)
            self._sizes = _without(self._sizes, i)
        else:
            self._starts[i] += size
            self._sizes[i] -= size
        self.free_slots -= size
        return start, size

    def release(self, start: int, size: int) -> None:
        """Mutates. Merge with the free neighbours so runs stay maximal."""
        i = int(np.searchsorted(self._starts, start))
        merge_prev = i > 0 and self._starts[i - 1] + self._sizes[i - 1] == start
        merge_next = i < self._starts.shape[0] and start + size == self._starts[i]
        if merge_prev and merge_next:
            self._sizes[i - 1] += size + self._sizes[i]
            self._starts = _without(self._starts, i)
            self._sizes = _without(self._sizes, i)
        elif merge_prev:
            self._sizes[i - 1] += size
        elif merge_next:
            self._starts[i] = start
            self._sizes[i] += size
        else:
            self._starts = _with(self._starts, i, start)
            self._sizes = _with(self._sizes, i, size)
        self.free_slots += size

    def free_extents(self) -> tuple[np.ndarray, np.ndarray]:
        """(starts, sizes) of the free extents, int64 [num_runs] each (copies)."""
        return self._starts.copy(), self._sizes.copy()

    def free_sizes(self) -> np.ndarray:
        """Sizes of the free extents, int64 [num_runs] (a view: do not mutate)."""
        return self._sizes

    def check(self) -> None:
        ends = self._starts + self._sizes
        if np.any(self._sizes <= 0) or np.any(ends[:-1] >= self._starts[1:]):
            raise AssertionError("free runs are empty, unsorted, overlapping or not maximal")


class BuddyPlacer:
    """Power-of-two buddy allocation. The slot space is cut into maximal aligned power-of-two
    regions (the binary digits of the capacity); a request is rounded up to a power of two (the
    round-up is internal fragmentation), served from the smallest free block that fits (lowest
    address among equals) by halving it, and a released block merges with its free buddy."""

    def __init__(self, capacity_slots: int) -> None:
        self.capacity_slots = capacity_slots
        self._free: list[set[int]] = [set() for _ in range(capacity_slots.bit_length())]  # by order
        self._region_starts: list[int] = []
        self._region_orders: list[int] = []
        start = 0
        for order in range(capacity_slots.bit_length() - 1, -1, -1):
            if capacity_slots >> order & 1:
                self._region_starts.append(start)
                self._region_orders.append(order)
                self._free[order].add(start)
                start += 1 << order
        self.free_slots = capacity_slots

    def alloc_size(self, size: int) -> int:
        return 1 << (size - 1).bit_length()

    def place(self, size: int) -> tuple[int, int] | None:
        """Mutates on success."""
        want = (size - 1).bit_length()
        order = next((k for k in range(want, len(self._free)) if self._free[k]), None)
        if order is None:
            return None
        start = min(self._free[order])
        self._free[order].remove(start)
        while order > want:  # keep the lower half, free the upper
            order -= 1
            self._free[order].add(start + (1 << order))
        self.free_slots -= 1 << want
        return start, 1 << want

    def release(self, start: int, size: int) -> None:
        """Mutates. Coalesce with free buddies up to the region's size."""
        order = size.bit_length() - 1
        self.free_slots += size
        top = self._region_orders[bisect.bisect_right(self._region_starts, start) - 1]
        while order < top and (start ^ (1 << order)) in self._free[order]:
            self._free[order].remove(start ^ (1 << order))
            start &= ~(1 << order)
            order += 1
        self._free[order].add(start)

    def free_extents(self) -> tuple[np.ndarray, np.ndarray]:
        """(starts, sizes) of the free buddy blocks, int64 [num_blocks] each, sorted by start."""
        pairs = sorted((s, 1 << k) for k, starts in enumerate(self._free) for s in starts)
        starts = np.array([p[0] for p in pairs], dtype=np.int64)
        return starts, np.array([p[1] for p in pairs], dtype=np.int64)

    def free_sizes(self) -> np.ndarray:
        """Sizes of the free buddy blocks, int64 [num_blocks]."""
        counts = [len(starts) for starts in self._free]
        return np.repeat(np.left_shift(1, np.arange(len(counts), dtype=np.int64)), counts)

    def check(self) -> None:
        for order, starts in enumerate(self._free):
            for start in starts:
                region = bisect.bisect_right(self._region_starts, start) - 1
                top = self._region_orders[region]
                region_end = self._region_starts[region] + (1 << top)
                if start % (1 << order) or order > top or start + (1 << order) > region_end:
                    raise AssertionError(f"free buddy block {start}+{1 << order} is misaligned or crosses its region")
                if order < top and (start ^ (1 << order)) in starts:
                    raise AssertionError(f"free buddies {start} and {start ^ (1 << order)} were not merged")


def _without(a: np.ndarray, i: int) -> np.ndarray:
    """`a` minus element i (np.delete's result, without its generality's cost)."""
    return np.concatenate((a[:i], a[i + 1:]))


def _with(a: np.ndarray, i: int, value: int) -> np.ndarray:
    """`a` with `value` inserted before position i."""
    return np.concatenate((a[:i], np.array([value], dtype=a.dtype), a[i:]))


def make_placer(fit: str, capacity_slots: int) -> RunPlacer | BuddyPlacer:
    if fit == "first":
        return RunPlacer(capacity_slots, best=False)
    if fit == "best":
        return RunPlacer(capacity_slots, best=True)
    if fit == "buddy":
        return BuddyPlacer(capacity_slots)
    raise ValueError(f"fit must be one of first, best, buddy; got {fit!r}")
