"""A strategy's sequence rows (`SeqRows`), lent to a compiled step loop (workbench.engine.compiled_paged).

Rows are the loop's sequence handles: it pops them from `free_rows` (top last, as `SeqRows` pops its list),
zeroes a freed row's columns and pushes it back; it keeps no sequence ids, since every sequence of the run is
gone when it ends. The pools that lend a strategy's arrays (`paged.compiled_pool`, `virtual.compiled_pool`)
build on this.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.seq_rows import SeqRows


class CompiledRows:
    """Mutates the rows it views (through the loop, and in `grow_rows` and `finish_rows`)."""

    def __init__(self, seqs: SeqRows) -> None:
        if len(seqs):
            raise ValueError("a compiled loop starts from a pool without sequences")
        self.seqs = seqs
        self.free_rows = np.zeros(seqs.capacity_rows, dtype=np.int64)  # top last, room for every row
        self.free_rows_top = len(seqs._free_rows)
        self.free_rows[:self.free_rows_top] = seqs._free_rows

    # the arrays, read at each loop call: growth replaces them
    @property
    def data(self) -> np.ndarray:
        return self.seqs._data

    def column(self, name: str) -> np.ndarray:
        return self.seqs.columns[name]

    @property
    def live(self) -> np.ndarray:
        return self.seqs.live

    @property
    def capacity_rows(self) -> int:
        return self.seqs.capacity_rows

    def grow_rows(self, free_rows_top: int) -> None:
        """Mutates. Twice the rows (`SeqRows._grow`), the new ones below the `free_rows_top` still free: they are
        popped once those are gone, the lowest first, as `SeqRows` grows when its last free row is taken."""
        seqs = self.seqs
        seqs._free_rows = []
        seqs._grow()
        self._rows_grown()
        added = np.array(seqs._free_rows, dtype=np.int64)
        rows = np.zeros(seqs.capacity_rows, dtype=np.int64)
        rows[:added.shape[0]] = added
        rows[added.shape[0]:added.shape[0] + free_rows_top] = self.free_rows[:free_rows_top]
        self.free_rows, self.free_rows_top = rows, added.shape[0] + free_rows_top

    def _rows_grown(self) -> None:
        """The strategy's per-row arrays beside `SeqRows` follow its growth."""

    def finish_rows(self, free_rows_top: int) -> None:
        """Mutates. The loop's run is over, every sequence gone: the free rows in the loop's order."""
        self.seqs._free_rows = self.free_rows[:free_rows_top].tolist()
        self.seqs._cached_ids = None
