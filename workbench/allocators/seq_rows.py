"""Dense row numbers for the caller's sequence ids, so per-sequence state lives in numpy columns.

A strategy keeps one int64 column per per-sequence field (`length`, `final_len`, ...) indexed by
row; a batch of sequence ids becomes one row array, and every per-step update is a vectorized
operation over it. Rows of freed sequences are reused. Columns grow by doubling, which replaces the
arrays: always reach them through this object (`rows.column("length")`), never keep a reference
across a call that may add a sequence.
"""

from __future__ import annotations

import numpy as np

_CACHED_MIN_IDS = 8  # shorter lookups (one group's admission) are not cached: the batch's stays


class SeqRows:
    def __init__(self, columns: tuple[str, ...], capacity_rows: int = 64) -> None:
        self._row_of: dict[int, int] = {}
        self._id_of_row: list[int] = [-1] * capacity_rows  # the sequence id in each live row
        self._free_rows: list[int] = list(range(capacity_rows - 1, -1, -1))  # pop() gives row 0 first
        # the columns as rows of one int64 [num_columns, capacity_rows] array (a removed row is zeroed in one
        # operation); `columns` maps each name to its row: one dict for good, its views replaced when the
        # array grows (a hot loop reads `columns["length"]` without a call)
        self._data = np.zeros((len(columns), capacity_rows), dtype=np.int64)
        self.columns = {name: self._data[i] for i, name in enumerate(columns)}
        self.live = np.zeros(capacity_rows, dtype=bool)  # [capacity_rows]
        # The last batch looked up and its rows: a decode step calls append and describe with the same
        # list, and the next step's batch is this one less the finished sequences (cut out here when they
        # are removed) plus those that joined at its end (looked up alone).
        self._cached_ids: list[int] | None = None
        self._cached_rows = np.zeros(0, dtype=np.int64)

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._row_of

    def none_live(self, seq_ids: list[int]) -> bool:
        """Whether no id of `seq_ids` is live (one set operation in C, not a lookup per id)."""
        return self._row_of.keys().isdisjoint(seq_ids)

    def all_live(self, seq_ids: set[int]) -> bool:
        """Whether every id of `seq_ids` is live (one set operation in C)."""
        return seq_ids <= self._row_of.keys()

    def __len__(self) -> int:
        return len(self._row_of)

    @property
    def capacity_rows(self) -> int:
        return self.live.shape[0]

    def column(self, name: str) -> np.ndarray:
        return self.columns[name]

    def ids(self) -> list[int]:
        return list(self._row_of)

    def add(self, seq_id: int) -> int:
        """Mutates. A fresh row (all columns zero) for a new sequence id."""
        if seq_id in self._row_of:
            raise ValueError(f"sequence {seq_id} is already live")
        if not self._free_rows:
            self._grow()
        row = self._free_rows.pop()
        self._row_of[seq_id] = row
        self._id_of_row[row] = seq_id
        self.live[row] = True  # the id was not live: no cached batch holds it
        return row

    def remove(self, seq_id: int) -> int:
        """Mutates. Forget the sequence; its row (returned) is zeroed and reused later."""
        row = self.row(seq_id)
        del self._row_of[seq_id]
        self._data[:, row] = 0
        self.live[row] = False
        self._free_rows.append(row)
        self._uncache(seq_id)
        return row

    def row(self, seq_id: int) -> int:
        try:
            return self._row_of[seq_id]
        except KeyError:
            raise KeyError(f"sequence {seq_id} is not live") from None

    def id_of(self, row: int) -> int:
        """The sequence id in a live row."""
        return self._id_of_row[row]

    def rows(self, seq_ids: list[int]) -> np.ndarray:
        """Rows of these sequences in this order, int64 [len(seq_ids)]; raises KeyError on an unknown
        id. Repeated ids are not checked here: verbs for which a repeat matters check it."""
        cached = self._cached_ids
        if seq_ids == cached:
            return self._cached_rows
        if cached is not None and len(seq_ids) > len(cached) and seq_ids[:len(cached)] == cached:
            # the cached batch with sequences joined at its end: only theirs are looked up
            rows = np.concatenate([self._cached_rows, self._lookup(seq_ids[len(cached):])])
        else:
            rows = self._lookup(seq_ids)
        if len(seq_ids) >= _CACHED_MIN_IDS:
            self._cached_ids = list(seq_ids)
            self._cached_rows = rows
        return rows

    def _lookup(self, seq_ids: list[int]) -> np.ndarray:
        try:
            return np.fromiter(map(self._row_of.__getitem__, seq_ids), dtype=np.int64, count=len(seq_ids))
        except KeyError as e:
            raise KeyError(f"sequence {e.args[0]} is not live") from None

    def _uncache(self, seq_id: int) -> None:
        """The cached batch without a removed sequence (a decode batch loses finished ones): cut out of the
        list and the rows, not looked up again."""
        cached = self._cached_ids
        if cached is None:
            return
        try:
            i = cached.index(seq_id)
        except ValueError:
            return
        del cached[i]  # the list is this object's own copy (`rows`)
        self._cached_rows = np.concatenate([self._cached_rows[:i], self._cached_rows[i + 1:]])
        try:  # a repeated id (a caller's error, refused later), after the first: look the batch up anew
            cached.index(seq_id, i)
            self._cached_ids = None
        except ValueError:
            pass

    def _grow(self) -> None:
        old = self.capacity_rows
        self._data = np.concatenate([self._data, np.zeros_like(self._data)], axis=1)
        for i, name in enumerate(self.columns):
            self.columns[name] = self._data[i]
        self.live = np.concatenate([self.live, np.zeros(old, dtype=bool)])
        self._id_of_row.extend([-1] * old)
        self._free_rows.extend(range(2 * old - 1, old - 1, -1))
