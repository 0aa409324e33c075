"""The per-step loop of the contiguous strategies, compiled with Numba (see `paged.loops` for why)."""

from __future__ import annotations

from numba import njit

from workbench.allocators.batch_check import check_batch


@njit(cache=True)
def append_extents(rows, start, length, final_len, swapped, row_mark, slots, apply):
    """Check the batch (`batch_check`); then, if `apply`, give each row the next slot of its extent
    (fills slots int64 [num_seqs], advances length). Changes nothing on a bad row. Returns (0, -1), or
    (negative status, index of the offending sequence in the batch). row_mark is restored."""
    status, bad = check_batch(rows, length, final_len, swapped, row_mark)
    if status != 0 or not apply:
        return status, bad
    for i in range(rows.shape[0]):
        r = rows[i]
        slots[i] = start[r] + length[r]
        length[r] += 1
    return 0, -1
