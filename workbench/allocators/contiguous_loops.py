"""The per-step loop of the contiguous strategies, compiled with Numba (see `paged_loops` for why)."""

from __future__ import annotations

from numba import njit

from workbench.allocators.paged_loops import PAST_FINAL, REPEATED, SWAPPED


@njit(cache=True)
def append_extents(rows, start, length, final_len, swapped, row_mark, slots, apply):
    """Check the batch; then, if `apply`, give each row the next slot of its extent (fills slots
    int64 [num_seqs], advances length). Changes nothing on a bad row. Returns (0, -1), or (PAST_FINAL
    | REPEATED | SWAPPED, index of the offending sequence in the batch). row_mark is restored."""
    status = 0
    bad = -1
    seen = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        if row_mark[r] != 0:
            status, bad = REPEATED, i
            break
        if swapped[r] != 0:
            status, bad = SWAPPED, i
            break
        if length[r] >= final_len[r]:
            status, bad = PAST_FINAL, i
            break
        row_mark[r] = 1
        seen = i + 1
    for i in range(seen):
        row_mark[rows[i]] = 0
    if status != 0 or not apply:
        return status, bad
    for i in range(rows.shape[0]):
        r = rows[i]
        slots[i] = start[r] + length[r]
        length[r] += 1
    return 0, -1
