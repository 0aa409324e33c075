"""A `VirtualContiguous`'s own arrays, lent to a compiled step loop (workbench.engine.compiled_paged).

The loop admits, appends and frees on these arrays with the functions of `virtual.loops` that the strategy's
own verbs and its `PagePool` call (`pick_extents`, `can_take`, `take`, `openings`, `can_open`, `apply_append`,
`opened`, `release`, `held_totals`), so there is one pool: after the run `finish` writes back what only Python
holds (the free rows, the pages reported to the clock) and the strategy is as a general run leaves it.
Unmappings are logged into scratch and dropped: only a kernel's KV pool reads them, and the loop runs none.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.compiled_rows import CompiledRows

# CONSTS, int64 [NUM_CONSTS]
PAGE_TOKENS, EXTENT_SLOTS, NUM_BUFFERS, REUSE, NUM_PAGES, MAX_BATCH, NUM_CONSTS = range(7)


class CompiledExtentPool(CompiledRows):
    """Mutates the strategy it views (through the loop, and in `grow_rows` and `finish`)."""

    def __init__(self, strategy) -> None:
        """`strategy`: a workbench.allocators.virtual.contiguous.VirtualContiguous without a host pool."""
        super().__init__(strategy._seqs)
        self.strategy = strategy
        pages = strategy._pages
        self.consts = np.zeros(NUM_CONSTS, dtype=np.int64)
        self.consts[[PAGE_TOKENS, EXTENT_SLOTS, NUM_BUFFERS, REUSE, NUM_PAGES, MAX_BATCH]] = (
            strategy.page_tokens, strategy.extent_slots, strategy.geometry.num_buffers, pages.reuse, pages.num_pages,
            strategy.max_batch)
        self.mapped_reported = strategy._mapped_reported
        self._log = np.zeros((strategy.max_batch + 1, 3), dtype=np.int64)  # one reclaim or one release

    def views(self) -> tuple:
        """(each row's extent, per extent: tokens written, final length, pages mapped, pages used, held; the page
        counters, the constants, scratch: a batch's extents, the extents to map, the slots appended, a picked
        extent, its pages, the unmapping log): the arrays the loop's extent verbs take, read at each call
        (growth replaces the rows)."""
        s, pages, rows = self.strategy, self.strategy._pages, self.capacity_rows
        return (self.column("extent"), s._length, s._final, pages.mapped, pages.used, pages.held, pages.counts,
                self.consts, np.zeros(rows, dtype=np.int64), np.zeros(rows, dtype=np.int64),
                np.zeros(rows, dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), self._log)

    def finish(self, free_rows_top: int, mapped_reported: int) -> None:
        """Mutates the strategy: the loop's run is over and every sequence gone. Raises AssertionError when an
        extent is still held."""
        s = self.strategy
        if s._pages.held.any():
            raise AssertionError(f"the compiled loop ended holding extents {np.flatnonzero(s._pages.held).tolist()}")
        s._mapped_reported = mapped_reported
        self.finish_rows(free_rows_top)
