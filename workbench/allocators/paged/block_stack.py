"""A stack of free block ids in one numpy array: O(k) push and pop of k blocks, no Python loop."""

from __future__ import annotations

import numpy as np
from numba import njit


class BlockStack:
    """Free block ids. A fresh stack pops 0, 1, 2, ... in that order (block ids in tests are exact)."""

    def __init__(self, num_blocks: int) -> None:
        self._ids = np.arange(num_blocks - 1, -1, -1, dtype=np.int32)  # [num_blocks]; top is the end
        self.size = num_blocks

    def pop(self, k: int) -> np.ndarray:
        """Mutates. Take k block ids, int32 [k]; raises if fewer are free."""
        if k > self.size:
            raise RuntimeError(f"out of blocks: need {k}, {self.size} free")
        taken = top_first(self._ids, self.size, k).copy()  # numpy's slicing here: a compiled call's view costs more
        self.size -= k
        return taken

    def push(self, ids: np.ndarray) -> None:
        """Mutates. Return blocks; `ids[0]` ends on top, so it is the next one popped."""
        self.size = push_blocks(self._ids, self.size, ids, ids.shape[0])

    def ids(self) -> np.ndarray:
        """The free block ids (a copy), int32 [size]."""
        return self._ids[:self.size].copy()

    def compiled_view(self) -> tuple[np.ndarray, int]:
        """(the id array, top last; the stack size) for a compiled pop or push, which must then call `popped` or
        `pushed`. The array holds every block id, so a push of released blocks always has room."""
        return self._ids, self.size

    def popped(self, k: int) -> None:
        """Mutates. A compiled caller took the top k ids of `compiled_view`."""
        self.size -= k

    def pushed(self, size: int) -> None:
        """Mutates. A compiled caller pushed ids onto `compiled_view` (`push_blocks`), which returned `size`."""
        self.size = size


# The stack's order: the class above and the compiled loops (paged.loops, the compiled step loop) pop and push
# through these.
def top_first(free_ids, free_size, k):
    """`BlockStack.pop`'s order: the top k ids of the stack `free_ids[:free_size]` (top last), top first, as a
    view (the caller copies it or uses it before the next push). The caller checks k <= free_size."""
    return free_ids[free_size - k:free_size][::-1]


pop_blocks = njit(cache=True)(top_first)  # the same order, for compiled callers


@njit(cache=True)
def push_blocks(free_ids, free_size, ids, n):
    """`BlockStack.push` of `ids[:n]`: `ids[0]` ends on top, so it is the next one popped. Returns the size."""
    for j in range(n):
        free_ids[free_size + n - 1 - j] = ids[j]
    return free_size + n
