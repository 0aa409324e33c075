"""One past the largest id of a small id array: how far a table indexed by block id must reach.

Compiled because the prefix indexes ask it of a step's few blocks several times a step, where NumPy's
reduction (`int(ids.max()) + 1`, a few µs of call overhead) costs more than the scan.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def id_bound(ids) -> int:
    """max(ids) + 1 of an integer array, 0 when it is empty."""
    bound = 0
    for i in range(ids.shape[0]):
        if ids[i] >= bound:
            bound = ids[i] + 1
    return bound
