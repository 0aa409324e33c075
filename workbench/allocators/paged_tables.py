"""Per-sequence block tables of a paged strategy, in one 2-D int32 array.

Row r of `_table` is the block table of the sequence in row r of `seqs`; only its first
`num_blocks[r]` entries are meaningful. The array grows by doubling in both directions (rows with
the number of live sequences, columns with the longest table), so its size tracks the live state,
not `max_model_len`. A batch's CSR page table is one gather with a flat index built by `np.repeat`:
O(total blocks of the batch) numpy work and no Python loop over sequences or blocks.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.base import PagedDescriptor
from workbench.allocators.seq_rows import SeqRows


class BlockTables:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.seqs = SeqRows(("length", "final_len", "num_blocks", "swapped"))
        self._table = np.zeros((self.seqs.capacity_rows, 16), dtype=np.int32)  # [capacity_rows, capacity_cols]

    @property
    def swapped(self) -> np.ndarray:
        """1 where the row's table holds host blocks (swapped out), int64 [capacity_rows]."""
        return self.seqs.column("swapped")

    def add(self, seq_id: int, blocks: np.ndarray, length: int, final_len: int) -> int:
        """Mutates. A new sequence with this table; returns its row."""
        row = self.seqs.add(seq_id)
        self._fit(blocks.shape[0])
        self._table[row, :blocks.shape[0]] = blocks
        self.seqs.column("length")[row] = length
        self.seqs.column("final_len")[row] = final_len
        self.seqs.column("num_blocks")[row] = blocks.shape[0]
        return row

    def remove(self, seq_id: int) -> None:
        """Mutates."""
        self.seqs.remove(seq_id)

    def blocks_of(self, row: int) -> np.ndarray:
        """The row's table, int32 [num_blocks] (a copy)."""
        return self._table[row, :self.seqs.column("num_blocks")[row]].copy()

    def last_blocks(self, rows: np.ndarray) -> np.ndarray:
        """Last table entry of each row, int32 [num_rows]."""
        return self._table[rows, self.seqs.column("num_blocks")[rows] - 1]

    def append_blocks(self, rows: np.ndarray, blocks: np.ndarray) -> None:
        """Mutates. Append blocks[i] to the table of rows[i]."""
        if rows.shape[0] == 0:
            return
        num_blocks = self.seqs.column("num_blocks")
        at = num_blocks[rows]
        self._fit(int(at.max()) + 1)
        self._table[rows, at] = blocks
        num_blocks[rows] += 1

    def set_entry(self, row: int, index: int, block: int) -> None:
        """Mutates. Replace one entry (copy-on-write)."""
        self._table[row, index] = block

    def entries_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """All table entries of these rows, concatenated in order, int32 [nnz], and the written slots
        of each entry's block as seen by its row, int64 [nnz]."""
        flat, indptr = self._flat_index(rows)
        entries = self._table.ravel()[flat]
        fills = np.full(flat.shape[0], self.block_size, dtype=np.int64)
        lengths = self.seqs.column("length")[rows]
        fills[indptr[1:] - 1] = lengths - (indptr[1:] - indptr[:-1] - 1) * self.block_size
        return entries, fills

    def replace_entries(self, rows: np.ndarray, entries: np.ndarray) -> None:
        """Mutates. Overwrite the tables of these rows with `entries` (laid out as `entries_of`)."""
        flat, _ = self._flat_index(rows)
        self._table.ravel()[flat] = entries

    def describe(self, rows: np.ndarray) -> PagedDescriptor:
        if self.swapped[rows].any():
            raise ValueError("cannot describe a swapped-out sequence")
        flat, indptr = self._flat_index(rows)
        num_blocks = indptr[1:] - indptr[:-1]
        last_page_len = self.seqs.column("length")[rows] - (num_blocks - 1) * self.block_size
        return PagedDescriptor(kv_indptr=indptr.astype(np.int32), kv_indices=self._table.ravel()[flat],
                               kv_last_page_len=last_page_len.astype(np.int32), block_size=self.block_size)

    def slot_mapping(self, seq_id: int, start: int, stop: int) -> np.ndarray:
        """Slots of positions [start, stop) of the sequence, int64 [stop - start]."""
        row = self.seqs.row(seq_id)
        length = int(self.seqs.column("length")[row])
        if not 0 <= start <= stop <= length:
            raise ValueError(f"positions [{start}, {stop}) outside sequence {seq_id} of {length} tokens")
        if self.swapped[row]:
            raise ValueError(f"sequence {seq_id} is swapped out")
        positions = np.arange(start, stop, dtype=np.int64)
        blocks = self._table[row, positions // self.block_size].astype(np.int64)
        return blocks * self.block_size + positions % self.block_size

    def on_device_rows(self) -> np.ndarray:
        """Rows of live, not swapped-out sequences, int64 [num]."""
        return np.flatnonzero(self.seqs.live & (self.swapped == 0))

    def reserved_slots(self, refcount: np.ndarray) -> int:
        """Unwritten slots of held blocks that a holder will write (module rule of `paged`). Only last
        blocks can be partial; a shared last block counts once, with its furthest-reaching holder."""
        bs = self.block_size
        rows = self.on_device_rows()
        num_blocks = self.seqs.column("num_blocks")[rows]
        block_start = (num_blocks - 1) * bs  # [num] first position of the last block
        fill = self.seqs.column("length")[rows] - block_start
        reach = np.minimum(self.seqs.column("final_len")[rows] - block_start, bs)
        gap = reach - fill  # [num] >= 0 because length <= final_len
        last = self._table[rows, num_blocks - 1]
        shared = refcount[last] > 1
        reserved = int(gap[~shared].sum())
        if shared.any():
            blocks, inverse = np.unique(last[shared], return_inverse=True)
            furthest = np.zeros(blocks.shape[0], dtype=np.int64)
            np.maximum.at(furthest, inverse, gap[shared])
            reserved += int(furthest.sum())
        return reserved

    def _flat_index(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Flat positions in `_table` of the rows' entries, int64 [nnz], and the CSR indptr [num_rows + 1]."""
        num_blocks = self.seqs.column("num_blocks")[rows]
        indptr = np.zeros(rows.shape[0] + 1, dtype=np.int64)
        np.cumsum(num_blocks, out=indptr[1:])
        nnz = int(indptr[-1])
        flat = np.repeat(rows * self._table.shape[1] - indptr[:-1], num_blocks) + np.arange(nnz)
        return flat, indptr

    def _fit(self, num_cols: int) -> None:
        rows_cap, cols_cap = self._table.shape
        want_rows = max(rows_cap, self.seqs.capacity_rows)
        want_cols = cols_cap
        while want_cols < num_cols:
            want_cols *= 2
        if (want_rows, want_cols) != (rows_cap, cols_cap):
            grown = np.zeros((want_rows, want_cols), dtype=np.int32)
            grown[:rows_cap, :cols_cap] = self._table
            self._table = grown
