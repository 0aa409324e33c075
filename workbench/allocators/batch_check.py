"""The check every strategy's decode append makes first: no sequence of the batch repeats, is swapped
out, or is already at its final length. Compiled, and called from the strategies' compiled append
loops (Numba inlines the call), so the check costs one pass over the batch.

Arrays: `rows` int64 [num_seqs] rows of the batch; `length`, `final_len`, `swapped` int64
[capacity_rows]; `row_mark` int64 [capacity_rows], all zero between calls.
"""

from __future__ import annotations

from numba import njit

PAST_FINAL = -1  # status: a sequence is at its final length
REPEATED = -2  # status: a row appears twice in the batch
SWAPPED_OUT = -3  # status: a sequence is swapped out


def raise_for_status(status: int, seq_ids: list[int], bad: int) -> None:
    """The ValueError for a negative status of `check_batch`."""
    why = {PAST_FINAL: "append past final_len", REPEATED: "sequence id repeats in the batch",
           SWAPPED_OUT: "sequence is swapped out"}[status]
    raise ValueError(f"{why}: sequence {seq_ids[bad]}")


@njit(cache=True)
def check_batch(rows, length, final_len, swapped, row_mark):
    """Pure (row_mark is restored). (0, -1) for a valid batch, else (PAST_FINAL | REPEATED | SWAPPED_OUT,
    index of the first offending sequence in the batch)."""
    status = 0
    bad = -1
    seen = 0  # rows [0, seen) were marked
    for i in range(rows.shape[0]):
        r = rows[i]
        if row_mark[r] != 0:
            status, bad = REPEATED, i
            break
        if swapped[r] != 0:
            status, bad = SWAPPED_OUT, i
            break
        if length[r] >= final_len[r]:
            status, bad = PAST_FINAL, i
            break
        row_mark[r] = 1
        seen = i + 1
    for i in range(seen):
        row_mark[rows[i]] = 0
    return status, bad
