"""Strict, vectorized reading of trace CSV files: every bad value becomes one WorkloadError that names
the file, the 1-based line (the header is line 1; a row whose quoted field spans lines is named by its
first line) and the column."""

from __future__ import annotations

import csv
import hashlib
import io
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.errors import WorkloadError
from workbench.workload.trace_bytes import read_trace_bytes

MAX_TOKENS = 2**31 - 1  # token counts beyond this are not lengths but garbage


CHUNK_ROWS = 200_000  # rows parsed at a time: a column of millions of rows is never held as strings
# numeric columns kept per process, by file content: a sweep's or the paper's points that read one trace parse
# each of its columns once (8 bytes a row each; the oldest goes first)
PARSED_COLUMNS_KEPT = 8
_parsed: OrderedDict[tuple[bytes, str, bool], np.ndarray] = OrderedDict()
_parsed_lock = threading.Lock()  # a Dask worker runs points on several threads


class CsvTable:
    """A CSV trace whose fields are parsed a chunk of rows at a time, one column per pass (`column_chunks`),
    so only numeric columns of the whole file are ever held. `columns` is the header; `num_rows` the data
    rows, trailing blank lines left out; `lines` the 1-based line each row starts on, int64 [num_rows]."""

    def __init__(self, path: Path, data: bytes, columns: list[str], num_rows: int) -> None:
        self.path = path
        self._data = data
        self.columns = columns
        self.num_rows = num_rows
        self.lines = _record_lines(data, num_rows)
        self._digest: bytes | None = None

    @property
    def digest(self) -> bytes:
        """A digest of the file's bytes, computed once."""
        if self._digest is None:
            self._digest = hashlib.blake2b(self._data, digest_size=20).digest()
        return self._digest

    def column_chunks(self, column: str) -> Iterator[pd.Series]:
        """The column's fields as strings, CHUNK_ROWS rows at a time, in order (rows < num_rows)."""
        index = self.columns.index(column)
        at = 0
        for chunk in _parse(self._data, usecols=[index]):
            if at >= self.num_rows:
                return
            yield chunk.iloc[:self.num_rows - at, 0]
            at += len(chunk)

    def text(self, column: str) -> np.ndarray:
        """The whole column as strings, object [num_rows] (a column of ids, not of numbers)."""
        parts = [chunk.to_numpy(dtype=object) for chunk in self.column_chunks(column)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=object)

    def field(self, column: str, row: int) -> str:
        """The field of one row, as written."""
        for at, chunk in with_offsets(self.column_chunks(column)):
            if row < at + len(chunk):
                return chunk.iloc[row - at]
        raise IndexError(f"row {row} of {self.num_rows}")


def with_offsets(chunks: Iterable[pd.Series]) -> Iterator[tuple[int, pd.Series]]:
    at = 0
    for chunk in chunks:
        yield at, chunk
        at += len(chunk)


def _parse(data: bytes, usecols: list[int] | None = None):
    """pandas' chunked reader of every field as a string (no NA guessing, blank lines kept as rows)."""
    return pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False, skip_blank_lines=False, engine="c",
                       encoding="utf-8", compression=None, chunksize=CHUNK_ROWS, usecols=usecols)


def read_csv(path: Path) -> CsvTable:
    """The file as a `CsvTable`, every row checked to have the header's fields. The file is read by
    content (`trace_bytes`: plain, gzip, bzip2 or xz, whatever its name). Trailing blank lines are
    ignored; a file with a header and no rows is an error."""
    data = read_trace_bytes(path)
    columns: list[str] = []
    num_rows = last_filled = 0  # rows seen; rows up to the last one with a field
    try:
        for chunk in _parse(data):
            if not isinstance(chunk.index, pd.RangeIndex):  # pandas took the first field of each row as an index
                raise WorkloadError(path, 2, None, f"as many fields as the header ({len(chunk.columns)})",
                                    f"{len(chunk.columns) + 1} fields")
            columns = [str(c) for c in chunk.columns]
            blank = (chunk == "").all(axis=1).to_numpy() if len(chunk.columns) else np.ones(len(chunk), dtype=bool)
            filled = np.flatnonzero(~blank)
            if filled.shape[0]:
                last_filled = num_rows + int(filled[-1]) + 1
            num_rows += len(chunk)
    except pd.errors.EmptyDataError:
        raise WorkloadError(path, 1, None, "a CSV header line; the file is empty") from None
    except pd.errors.ParserError as exc:
        raise WorkloadError(path, _parser_error_line(str(exc)), None, "as many fields as the header",
                            str(exc).strip()) from None
    except UnicodeDecodeError as exc:
        raise WorkloadError(path, None, None, "UTF-8 text", exc.reason) from None
    if last_filled == 0:
        raise WorkloadError(path, 2, None, "at least one data row after the header")
    return CsvTable(path, data, columns, last_filled)


def _record_lines(data: bytes, num_rows: int) -> np.ndarray:
    """The line each data row starts on, int64 [num_rows]. One row per line after the header line, unless a
    quoted field spans lines: then the rows are walked with the csv module, which counts the lines."""
    plain = np.arange(num_rows, dtype=np.int64) + 2
    if b'"' not in data:
        return plain
    reader = csv.reader(io.StringIO(data.decode("utf-8"), newline=""))
    starts, end = [], 0
    for _ in reader:
        starts.append(end + 1)
        end = reader.line_num
    starts = starts[1:]  # the header
    # the two parsers disagree only on malformed quoting, which pandas reported above
    return np.array(starts, dtype=np.int64) if len(starts) == num_rows else plain


def require_columns(path: Path, table: CsvTable, columns: tuple[str, ...]) -> None:
    for column in columns:
        if column not in table.columns:
            raise WorkloadError(path, 1, column, f"a column named {column!r} in the header", ",".join(table.columns))


def numbers(path: Path, table: CsvTable, column: str, *, integer: bool) -> np.ndarray:
    """The column as finite, non-negative numbers: int64 when `integer`, else float64, [rows] (a new array)."""
    key = (table.digest, column, integer)
    with _parsed_lock:
        kept = _parsed.get(key)
        if kept is not None:
            _parsed.move_to_end(key)
            return kept.copy()
    parts = []
    for at, raw in with_offsets(table.column_chunks(column)):
        values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)  # [rows], NaN where unparsable
        bad = ~np.isfinite(values) | (values < 0)
        if integer:
            bad |= (values != np.round(values)) | (values > MAX_TOKENS)
        if bad.any():
            i = int(np.argmax(bad))
            kind = "a non-negative integer" if integer else "a finite non-negative number"
            raise WorkloadError(path, int(table.lines[at + i]), column, kind, raw.iloc[i])
        parts.append(values.astype(np.int64) if integer else values)
    column_values = np.concatenate(parts)
    with _parsed_lock:
        _parsed[key] = column_values.copy()
        while len(_parsed) > PARSED_COLUMNS_KEPT:
            _parsed.popitem(last=False)
    return column_values


def check_non_decreasing(path: Path, table: CsvTable, column: str, times: np.ndarray) -> None:
    back = np.flatnonzero(np.diff(times) < 0)
    if len(back):
        i = int(back[0]) + 1
        raise WorkloadError(path, int(table.lines[i]), column, f"a time not before the previous row's "
                            f"({table.field(column, i - 1)}): timestamps must not go backwards",
                            table.field(column, i))


def _parser_error_line(message: str) -> int | None:
    # pandas: "Error tokenizing data. C error: Expected 3 fields in line 5, saw 4"
    marker = " in line "
    if marker in message:
        digits = message.split(marker, 1)[1].split(",", 1)[0].strip()
        if digits.isdigit():
            return int(digits)
    return None
