"""Per-sequence block tables of a paged strategy, in one 2-D int32 array.

Row r of `_table` is the block table of the sequence in row r of `seqs`; only its first
`num_blocks[r]` entries are meaningful. The array grows by doubling in both directions (rows with
the number of live sequences, columns with the longest table), so its size tracks the live state,
not `max_model_len`. A batch's CSR page table is one compiled gather (`paged.loops.gather_tables`),
O(total blocks of the batch); the rarer whole-group operations (swap) use a flat index built with
`np.repeat`.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.batch_check import raise_for_status
from workbench.allocators.paged import loops
from workbench.allocators.paged.block_stack import BlockStack
from workbench.allocators.seq_rows import SeqRows
from workbench.allocators.values import PagedDescriptor
from workbench.intmath import cdiv


class BlockTables:
    def __init__(self, block_size: int, num_blocks: int) -> None:
        self.block_size = block_size
        # last_block: each row's last table entry, kept with every change to it (the decode loops read it
        # instead of the row's table, which a step over a large batch would otherwise pull into cache)
        self.seqs = SeqRows(("length", "final_len", "num_blocks", "last_block", "swapped", "mark"))
        self._table = np.zeros((self.seqs.capacity_rows, 16), dtype=np.int32)  # [capacity_rows, capacity_cols]
        self._scratch = np.zeros(num_blocks, dtype=np.int64)  # [num_blocks], zero between loop calls

    @property
    def swapped(self) -> np.ndarray:
        """1 where the row's table holds host blocks (swapped out), int64 [capacity_rows]."""
        return self.seqs.column("swapped")

    def add(self, seq_id: int, blocks: np.ndarray, length: int, final_len: int) -> int:
        """Mutates. A new sequence with this table; returns its row."""
        row = self.seqs.add(seq_id)
        self._fit(blocks.shape[0])
        c = self.seqs.columns
        loops.fill_row(row, blocks, length, final_len, self._table, c["length"], c["final_len"], c["num_blocks"],
                       c["last_block"])
        return row

    def add_compiled(self, seq_ids: list[int], num_cols: int, place):
        """Mutates. New sequences whose rows a compiled call fills (`loops.fill_row`): their rows are added and the
        tables made at least `num_cols` wide, then `place(rows, table, length, final_len, num_blocks, last_block)`
        runs (rows int64 [n], in the order of `seq_ids`); returns what it returns."""
        rows = np.fromiter(map(self.seqs.add, seq_ids), dtype=np.int64, count=len(seq_ids))
        self._fit(num_cols)
        c = self.seqs.columns  # after the adds: a grown table replaces the columns
        return place(rows, self._table, c["length"], c["final_len"], c["num_blocks"], c["last_block"])

    def extend_row(self, row: int, blocks: np.ndarray, length: int) -> None:
        """Mutates. The row's table gains `blocks` (int32 [k]) at its end and holds `length` tokens."""
        num_blocks = int(self.seqs.columns["num_blocks"][row])
        self._fit(num_blocks + blocks.shape[0])
        self._table[row, num_blocks:num_blocks + blocks.shape[0]] = blocks
        self.seqs.columns["num_blocks"][row] = num_blocks + blocks.shape[0]
        self.seqs.columns["length"][row] = length
        if blocks.shape[0]:
            self.seqs.columns["last_block"][row] = blocks[-1]

    def truncate_rows(self, rows: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Mutates. Each row of `rows` (distinct, int64 [k]) holds only its first `lengths[i]` (>= 1) tokens;
        returns the table entries past them, row after row, int32 (the caller drops their references)."""
        c = self.seqs.columns
        kept = cdiv(lengths, self.block_size)  # [k] blocks each row keeps
        cut = c["num_blocks"][rows] - kept  # [k] entries each row drops
        starts = np.repeat(rows * self._table.shape[1] + kept - np.cumsum(cut) + cut, cut)
        dropped = self._table.ravel()[starts + np.arange(int(cut.sum()))]
        c["length"][rows] = lengths
        c["num_blocks"][rows] = kept
        c["last_block"][rows] = self._table[rows, kept - 1]
        return dropped

    def blocks_at(self, rows: np.ndarray, index: np.ndarray) -> np.ndarray:
        """The table entry `index[i]` of each row `rows[i]` (-1 where the index is -1), int32 [len(rows)]."""
        return np.where(index >= 0, self._table[rows, np.maximum(index, 0)], -1).astype(np.int32)

    def remove(self, seq_id: int) -> None:
        """Mutates."""
        self.seqs.remove(seq_id)

    def blocks_of(self, row: int) -> np.ndarray:
        """The row's table, int32 [num_blocks] (a copy)."""
        return self._table[row, :self.seqs.column("num_blocks")[row]].copy()

    def last_two_blocks(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The last table entry of each row and the entry before it (-1 for a one-block row), int32
        [len(rows)] each: the block a decode step filled and its predecessor."""
        last = np.empty(rows.shape[0], dtype=np.int32)
        before = np.empty(rows.shape[0], dtype=np.int32)
        loops.last_two_blocks(rows, self._table, self.seqs.column("num_blocks"), last, before)
        return last, before

    def entries_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All table entries of these rows, concatenated in order, int32 [nnz]; the written slots of each
        entry's block as seen by its row, int64 [nnz]; and where each row's entries start, int64 [len(rows) + 1]."""
        flat, indptr = self._flat_index(rows)
        entries = self._table.ravel()[flat]
        fills = np.full(flat.shape[0], self.block_size, dtype=np.int64)
        lengths = self.seqs.column("length")[rows]
        fills[indptr[1:] - 1] = lengths - (indptr[1:] - indptr[:-1] - 1) * self.block_size
        return entries, fills, indptr

    def replace_entries(self, rows: np.ndarray, entries: np.ndarray) -> None:
        """Mutates. Overwrite the tables of these rows with `entries` (laid out as `entries_of`)."""
        flat, indptr = self._flat_index(rows)
        self._table.ravel()[flat] = entries
        has_blocks = indptr[1:] > indptr[:-1]
        self.seqs.columns["last_block"][rows[has_blocks]] = entries[indptr[1:][has_blocks] - 1]

    def describe(self, rows: np.ndarray) -> PagedDescriptor:
        c = self.seqs.column
        if c("swapped")[rows].any():
            raise ValueError("cannot describe a swapped-out sequence")
        indptr, indices, last_page_len = loops.gather_tables(rows, c("length"), c("num_blocks"), self._table,
                                                             self.block_size)
        return PagedDescriptor(kv_indptr=indptr, kv_indices=indices, kv_last_page_len=last_page_len,
                               block_size=self.block_size)

    def count_append(self, seq_ids: list[int], rows: np.ndarray, refcount: np.ndarray) -> int:
        """Pure. Blocks `apply_append(rows)` will take (new blocks and copies); raises ValueError for
        a repeated, swapped-out or finished sequence."""
        c = self.seqs.column
        num_new, widest = loops.count_append(rows, c("length"), c("final_len"), c("num_blocks"), c("swapped"),
                                             c("last_block"), refcount, self.block_size, self._scratch, c("mark"),
                                             False, True)
        if num_new < 0:
            raise_for_status(num_new, seq_ids, widest)
        self._fit(widest)
        return num_new

    def apply_append(self, rows: np.ndarray, refcount: np.ndarray, new_blocks: np.ndarray):
        """Mutates tables, lengths and refcount (see paged_loops.apply_append). Returns (slots int64
        [num_seqs], copies int32 [num_copies, 2], slots copied, tables grown)."""
        c = self.seqs.column
        slots = np.empty(rows.shape[0], dtype=np.int64)
        copies = np.empty((new_blocks.shape[0], 2), dtype=np.int32)
        num_copies, copied_slots, grown = loops.apply_append(rows, c("length"), c("num_blocks"), c("last_block"),
                                                             self._table, refcount, self.block_size, new_blocks, slots,
                                                             copies, False)
        return slots, copies[:num_copies], copied_slots, grown

    def append_from(self, seq_ids: list[int], rows: np.ndarray, refcount: np.ndarray, stack: BlockStack):
        """`count_append` and `apply_append` with blocks popped from `stack`, in one compiled call. Returns None,
        changing nothing, when the stack holds too few blocks; else what `apply_append` returns."""
        slots = np.empty(rows.shape[0], dtype=np.int64)
        copies = np.empty((rows.shape[0], 2), dtype=np.int32)  # a sequence takes at most one block

        def append(length, final_len, num_blocks, swapped, last_block, table, scratch, mark):
            free_ids, free_size = stack.compiled_view()
            return loops.decode_append(rows, length, final_len, num_blocks, swapped, last_block, table, refcount,
                                       self.block_size, scratch, mark, free_ids, free_size, slots, copies, False,
                                       True)

        done = self.append_compiled(seq_ids, append)
        if done is None:
            return None
        taken, num_copies, copied_slots, grown = done
        stack.popped(taken)
        return slots, copies[:num_copies], copied_slots, grown

    def append_compiled(self, seq_ids: list[int], append):
        """Runs a compiled decode append over these tables: `append(length, final_len, num_blocks, swapped,
        last_block, table, scratch, mark)` returns (status, x, ...) with `loops.decode_append`'s statuses. While
        it asks to WIDEN (changing nothing), the tables are widened to x columns (rare) and it is called again;
        an error status raises. Returns None for NO_ROOM, else what follows the status."""
        c = self.seqs.columns
        while True:
            result = append(c["length"], c["final_len"], c["num_blocks"], c["swapped"], c["last_block"], self._table,
                            self._scratch, c["mark"])
            if result[0] != loops.WIDEN:
                break
            self._fit(result[1])
        if result[0] < 0:
            raise_for_status(result[0], seq_ids, result[1])
        return None if result[0] == loops.NO_ROOM else result[1:]

    def release_row(self, row: int, refcount: np.ndarray) -> tuple[np.ndarray, int]:
        """Mutates refcount: the row lets go of its blocks. Returns the blocks that reached refcount 0
        (int32, head first) and the written slots they held."""
        c = self.seqs.columns
        released = np.empty(int(c["num_blocks"][row]), dtype=np.int32)
        n, written = loops.release_row(row, c["length"], c["num_blocks"], self._table, refcount, self.block_size,
                                       released)
        return released[:n], written

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
        """Unwritten slots of held blocks that a holder will write (module rule of `paged`)."""
        c = self.seqs.columns
        return int(loops.reserved_slots(self.seqs.live, c["swapped"], c["length"], c["final_len"], c["num_blocks"],
                                        c["last_block"], refcount, self.block_size, self._scratch, False))

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
