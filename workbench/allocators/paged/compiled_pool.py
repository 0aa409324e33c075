"""A `PagedStrategy`'s own arrays, lent to a compiled step loop (workbench.engine.compiled_paged).

The loop admits, appends and frees on these arrays with the functions of `paged.loops` that the strategy's
own verbs call (`pop_blocks`, `fill_row`, `decode_append`, `release_row`, `push_blocks`, `reserved_slots`), so
there is one pool: after the run `finish` writes back what only Python holds (the stack's size, the free rows,
the counters) and the strategy is as a general run leaves it, its integrity check included.

Rows are the loop's sequence handles (`CompiledRows`).
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.compiled_rows import CompiledRows


class CompiledPool(CompiledRows):
    """Mutates the strategy it views (through the loop, and in `grow_rows`, `widen` and `finish`)."""

    def __init__(self, strategy) -> None:
        """`strategy`: a workbench.allocators.paged.strategy.PagedStrategy without prefix cache or tiers."""
        super().__init__(strategy.tables.seqs)
        self.strategy = strategy
        self.counts = strategy.counts  # the strategy's own counters (`paged.pool_counts`)
        self.free_ids = strategy._free._ids
        self.free_size = strategy._free.size

    # the arrays, read at each loop call: growth replaces them
    @property
    def table(self) -> np.ndarray:
        return self.strategy.tables._table

    @property
    def refcount(self) -> np.ndarray:
        return self.strategy._refcount

    @property
    def scratch(self) -> np.ndarray:
        return self.strategy.tables._scratch

    def _rows_grown(self) -> None:
        self.strategy.tables._fit(0)  # the table's rows follow

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
        s._free.size = free_size
        self.finish_rows(free_rows_top)
