"""A hybrid pool's accounting of one layer group over the live rows, in one compiled pass (`HybridPaged._group_parts`).

Only a sequence's last block can be partly written, so a group's token and reserved slots follow from its held
blocks (counted as they change) and each sequence's last block: holders of a shared last block see the same fill
and count it once, reserved up to the furthest any of them will write.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from workbench.intmath import cdiv


@njit(cache=True)
def last_block_parts(live, length, final_len, last, first_live, block_size, reach_of):
    """Pure (`reach_of` is scratch). Over the rows `live` (bool [capacity_rows]) of a group whose rows' last entry
    starts with block `last` and whose first held entry is `first_live` (int64 [capacity_rows] each), with `length`
    and `final_len` the rows' tokens now and at the end: returns (distinct last blocks, their written slots,
    their reserved slots: each one's furthest reach less its fill, held entries, written slots of the held
    entries, table entries). `reach_of` (int64 [num_blocks]) holds -1 everywhere, and does again on return."""
    seen = np.empty(live.shape[0], dtype=np.int64)  # the distinct last blocks, in row order
    fills = np.empty(live.shape[0], dtype=np.int64)  # the written slots of each, as its first holder sees them
    distinct = held_entries = logical = entries = 0
    for r in range(live.shape[0]):
        if not live[r]:
            continue
        num_entries = cdiv(length[r], block_size)
        start = (num_entries - 1) * block_size  # where the last block starts
        reach = min(final_len[r] - start, block_size)  # the slots of it written when the sequence finishes
        b = last[r]
        if reach_of[b] < 0:
            seen[distinct] = b
            fills[distinct] = length[r] - start
            distinct += 1
            reach_of[b] = reach
        elif reach > reach_of[b]:
            reach_of[b] = reach
        held_entries += num_entries - first_live[r]
        logical += length[r] - first_live[r] * block_size
        entries += num_entries
    written = reserved = 0
    for j in range(distinct):
        written += fills[j]
        reserved += reach_of[seen[j]] - fills[j]
        reach_of[seen[j]] = -1
    return distinct, written, reserved, held_entries, logical, entries
