"""Strict, vectorized reading of trace CSV files: every bad value becomes one WorkloadError that names
the file, the 1-based line (the header is line 1; a row whose quoted field spans lines is named by its
first line) and the column."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.errors import WorkloadError
from workbench.workload.trace_bytes import read_trace_bytes

MAX_TOKENS = 2**31 - 1  # token counts beyond this are not lengths but garbage


def read_csv(path: Path) -> tuple[pd.DataFrame, np.ndarray]:
    """(every field as a string, line number of each row int64 [rows]). The file is read by content
    (`trace_bytes`: plain, gzip, bzip2 or xz, whatever its name). Trailing blank lines are ignored; a
    file with a header and no rows is an error."""
    data = read_trace_bytes(path)
    try:
        frame = pd.read_csv(io.BytesIO(data), dtype=str, keep_default_na=False, skip_blank_lines=False, engine="c",
                            encoding="utf-8", compression=None)
    except pd.errors.EmptyDataError:
        raise WorkloadError(path, 1, None, "a CSV header line; the file is empty") from None
    except pd.errors.ParserError as exc:
        raise WorkloadError(path, _parser_error_line(str(exc)), None, "as many fields as the header",
                            str(exc).strip()) from None
    except UnicodeDecodeError as exc:
        raise WorkloadError(path, None, None, "UTF-8 text", exc.reason) from None
    lines = _record_lines(data, len(frame))  # [rows]
    blank = (frame == "").all(axis=1).to_numpy() if len(frame.columns) else np.ones(len(frame), dtype=bool)
    num_rows = len(frame)
    while num_rows and blank[num_rows - 1]:
        num_rows -= 1
    if num_rows == 0:
        raise WorkloadError(path, 2, None, "at least one data row after the header")
    return frame.iloc[:num_rows], lines[:num_rows]


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


def require_columns(path: Path, frame: pd.DataFrame, columns: tuple[str, ...]) -> None:
    for column in columns:
        if column not in frame.columns:
            raise WorkloadError(path, 1, column, f"a column named {column!r} in the header",
                                ",".join(map(str, frame.columns)))


def numbers(path: Path, frame: pd.DataFrame, lines: np.ndarray, column: str, *, integer: bool) -> np.ndarray:
    """The column as finite, non-negative numbers: int64 when `integer`, else float64, [rows]."""
    raw = frame[column]
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)  # [rows], NaN where unparsable
    bad = ~np.isfinite(values) | (values < 0)
    if integer:
        bad |= (values != np.round(values)) | (values > MAX_TOKENS)
    if bad.any():
        i = int(np.argmax(bad))
        kind = "a non-negative integer" if integer else "a finite non-negative number"
        raise WorkloadError(path, int(lines[i]), column, kind, raw.iloc[i])
    return values.astype(np.int64) if integer else values


def check_non_decreasing(path: Path, lines: np.ndarray, column: str, times: np.ndarray, raw: pd.Series) -> None:
    back = np.flatnonzero(np.diff(times) < 0)
    if len(back):
        i = int(back[0]) + 1
        raise WorkloadError(path, int(lines[i]), column, f"a time not before the previous row's "
                            f"({raw.iloc[i - 1]}): timestamps must not go backwards", raw.iloc[i])


def _parser_error_line(message: str) -> int | None:
    # pandas: "Error tokenizing data. C error: Expected 3 fields in line 5, saw 4"
    marker = " in line "
    if marker in message:
        digits = message.split(marker, 1)[1].split(",", 1)[0].strip()
        if digits.isdigit():
            return int(digits)
    return None
