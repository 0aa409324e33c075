"""The check every strategy's decode append makes first: no sequence of the batch repeats, is swapped
out, or is already at its final length. Compiled: `check_batch` is one pass over the batch, and a
compiled append that already passes over the batch calls `row_status` for each row instead.

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
def row_status(marked, swapped, length, final_len):
    """0 when a row may join the batch, else REPEATED | SWAPPED_OUT | PAST_FINAL. Scalars: a compiled loop calls
    it per row (a call with array arguments would count references per row)."""
    if marked != 0:
        return REPEATED
    if swapped != 0:
        return SWAPPED_OUT
    if length >= final_len:
        return PAST_FINAL
    return 0


@njit(cache=True)
def check_batch(rows, length, final_len, swapped, row_mark):
    """Pure (row_mark is restored). (0, -1) for a valid batch, else (PAST_FINAL | REPEATED | SWAPPED_OUT,
    index of the first offending sequence in the batch)."""
    status = 0
    seen = rows.shape[0]  # rows [0, seen) were marked
    for i in range(rows.shape[0]):
        r = rows[i]
        status = row_status(row_mark[r], swapped[r], length[r], final_len[r])
        if status != 0:
            seen = i
            break
        row_mark[r] = 1
    for i in range(seen):
        row_mark[rows[i]] = 0
    return (status, seen) if status != 0 else (0, -1)
