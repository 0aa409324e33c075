"""The block tables of one layer group of a hybrid paged pool (docs/hybrid.md).

A group of `units` pool units (each `unit_layers` layers) stores one logical block of a sequence
as `units` pool blocks, one per unit: table entry i of a sequence is an int32 array [units], or
None once the block fell entirely out of a sliding window and was released. Released entries are
always a leading run of the table (a window only moves forward), so the `first_live` column says, per
row of the pool's `SeqRows`, where the live part starts. The kernel reads unit 0 of each entry: the
workbench runs one layer per group.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.seq_rows import SeqRows
from workbench.intmath import cdiv

NULL_BLOCK = 0  # kernel-table placeholder for a released entry; a windowed kernel never reads it


def group_columns(index: int) -> tuple[str, str]:
    """The `SeqRows` columns of group `index`: (first held entry, unit 0 of the last entry)."""
    return f"first_live{index}", f"last{index}"


class GroupTables:
    def __init__(self, window_tokens: int | None, units: int, block_size: int, seqs: SeqRows, index: int) -> None:
        """`seqs`: the pool's rows, with this group's `group_columns(index)`."""
        self.window_tokens = window_tokens
        self.units = units
        self.block_size = block_size
        self.entries: dict[int, list[np.ndarray | None]] = {}  # seq id -> logical blocks, int32 [units] each
        self.seqs = seqs
        self._first_live_column, self._last_column = group_columns(index)

    @property
    def first_live(self) -> np.ndarray:
        """int64 [capacity_rows]: per row, the index of its sequence's first held entry (a column of `seqs`:
        read it anew after a sequence is added, which may replace the columns)."""
        return self.seqs.columns[self._first_live_column]

    @property
    def last(self) -> np.ndarray:
        """int64 [capacity_rows]: per row, unit 0 of its sequence's last entry (always held), read over a batch
        (a column of `seqs`, as `first_live`)."""
        return self.seqs.columns[self._last_column]

    def live(self, seq_id: int) -> list[np.ndarray]:
        """The held entries of a sequence, int32 [units] each, in table order."""
        return self.entries[seq_id][int(self.first_live[self.seqs.row(seq_id)]):]

    def held_blocks(self, seq_id: int) -> np.ndarray:
        """Every pool block the sequence holds in this group, int32 [num_live × units]."""
        live = self.live(seq_id)
        return np.concatenate(live) if live else np.zeros(0, dtype=np.int32)

    def dead_before(self, length: int | np.ndarray) -> int | np.ndarray:
        """Logical blocks a sequence of `length` tokens no longer needs once it decodes the token at
        position `length`: that query reads positions >= length − W + 1, so every block ending at or
        before that position is dead. 0 for full attention. Elementwise for an int64 array of lengths."""
        if self.window_tokens is None:
            return 0 * length
        if isinstance(length, np.ndarray):
            return np.maximum(length - self.window_tokens + 1, 0) // self.block_size
        return max(0, length - self.window_tokens + 1) // self.block_size

    def release_before(self, seq_id: int, row: int, dead: int) -> list[np.ndarray]:
        """Mutates. Drop the entries of the sequence (in `row`) before index `dead`, its `dead_before` at most its
        table's length; returns the ones it held."""
        table, first = self.entries[seq_id], int(self.first_live[row])
        if dead <= first:
            return []
        released = [e for e in table[first:dead] if e is not None]
        for i in range(first, dead):
            table[i] = None
        self.first_live[row] = dead
        return released

    def slot_mapping(self, seq_id: int, start: int, stop: int) -> np.ndarray:
        """Unit-0 slots of positions [start, stop), int64 [stop - start]; a released position is an error."""
        bs = self.block_size
        pos = np.arange(start, stop, dtype=np.int64)
        table = self.entries[seq_id]
        if stop > start and start // bs < self.first_live[self.seqs.row(seq_id)]:
            raise ValueError(f"positions from {start} of sequence {seq_id} left the window and were released")
        firsts = np.array([table[i][0] for i in range(start // bs, cdiv(stop, bs))], dtype=np.int64)
        return firsts[pos // bs - start // bs] * bs + pos % bs

    def kernel_table(self, seq_id: int) -> np.ndarray:
        """Unit-0 block ids of every logical block, released ones as NULL_BLOCK, int32 [num_logical]."""
        return np.array([NULL_BLOCK if e is None else e[0] for e in self.entries[seq_id]], dtype=np.int32)
