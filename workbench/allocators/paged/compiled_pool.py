"""A `PagedStrategy`'s own arrays, lent to a compiled step loop (workbench.engine.compiled_paged).

The loop admits, appends and frees on these arrays with the functions of `paged.loops` that the strategy's
own verbs call (`pop_blocks`, `fill_row`, `decode_append`, `release_row`, `push_blocks`, `reserved_slots`), so
there is one pool: after the run `finish` writes back what only Python holds (the stack's size, the free rows,
the counters) and the strategy is as a general run leaves it, its integrity check included.

Rows are the loop's sequence handles: it pops them from `free_rows` (top last, as `SeqRows` pops its list) and
pushes them back; it keeps no sequence ids, since every sequence of the run is gone when it ends.
"""

from __future__ import annotations

import numpy as np


class CompiledPool:
    """Mutates the strategy it views (through the loop, and in `grow_rows`, `widen` and `finish`)."""

    def __init__(self, strategy) -> None:
        """`strategy`: a workbench.allocators.paged.strategy.PagedStrategy without prefix cache or tiers."""
        self.strategy = strategy
        seqs = strategy.tables.seqs
        if len(seqs):
            raise ValueError("a compiled loop starts from a pool without sequences")
        self.free_rows = np.zeros(seqs.capacity_rows, dtype=np.int64)  # top last, room for every row
        self.free_rows_top = len(seqs._free_rows)
        self.free_rows[:self.free_rows_top] = seqs._free_rows
        self.counts = strategy.counts  # the strategy's own counters (`paged.pool_counts`)
        self.free_ids = strategy._free._ids
        self.free_size = strategy._free.size

    # the arrays, read at each loop call: growth replaces them
    @property
    def data(self) -> np.ndarray:
        return self.strategy.tables.seqs._data

    def column(self, name: str) -> np.ndarray:
        return self.strategy.tables.seqs.columns[name]

    @property
    def live(self) -> np.ndarray:
        return self.strategy.tables.seqs.live

    @property
    def table(self) -> np.ndarray:
        return self.strategy.tables._table

    @property
    def refcount(self) -> np.ndarray:
        return self.strategy._refcount

    @property
    def scratch(self) -> np.ndarray:
        return self.strategy.tables._scratch

    @property
    def capacity_rows(self) -> int:
        return self.strategy.tables.seqs.capacity_rows

    def grow_rows(self, free_rows_top: int) -> None:
        """Mutates. Twice the rows (`SeqRows._grow`), the new ones below the `free_rows_top` still free: they are
        popped once those are gone, the lowest first, as `SeqRows` grows when its last free row is taken."""
        seqs = self.strategy.tables.seqs
        seqs._free_rows = []
        seqs._grow()
        self.strategy.tables._fit(0)  # the table's rows follow
        added = np.array(seqs._free_rows, dtype=np.int64)
        rows = np.zeros(seqs.capacity_rows, dtype=np.int64)
        rows[:added.shape[0]] = added
        rows[added.shape[0]:added.shape[0] + free_rows_top] = self.free_rows[:free_rows_top]
        self.free_rows, self.free_rows_top = rows, added.shape[0] + free_rows_top

    def widen(self, num_cols: int) -> None:
        """Mutates. Tables at least `num_cols` wide (`BlockTables._fit`)."""
        self.strategy.tables._fit(num_cols)

    def finish(self, free_size: int, free_rows_top: int, cached: int = 0) -> None:
        """Mutates the strategy: the loop's run is over and every sequence gone; what only Python holds is
        written back. Raises AssertionError when a block is still held (neither free nor among the `cached`
        blocks a prefix cache keeps) or a counter is not back at zero."""
        s = self.strategy
        if free_size + cached != s.num_blocks or self.counts.any():
            raise AssertionError(f"the compiled loop ended holding {s.num_blocks - free_size - cached} of "
                                 f"{s.num_blocks} blocks (written, logical, table entries: {self.counts.tolist()})")
        seqs = s.tables.seqs
        s._free.size = free_size
        seqs._free_rows = self.free_rows[:free_rows_top].tolist()
        seqs._cached_ids = None
