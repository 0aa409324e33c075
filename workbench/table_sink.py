"""Where a run's tables go while it runs (docs/outputs.md): kept in memory, or written to Parquet.

A run hands its step and request rows to a sink in chunks, in table order, as it produces them; the
summary is then computed from the chunks read back in the same order (workbench.results). Two sinks
share that interface:

- `MemorySink` keeps the chunks; `frame(name)` is the whole table as one DataFrame.
- `ParquetSink(dir)` writes each chunk as one row group of `dir/<name>.parquet` the moment it arrives,
  so a run of millions of steps holds one chunk at a time. The file is the one `DataFrame.to_parquet(
  index=False)` of the whole table would write: same schema (pandas metadata included) and values;
  only the row-group boundaries differ.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

# rows a table buffers before it hands them to the sink (one Parquet row group): a step row waits as a tuple
# of Python numbers, ~700 bytes, so 16k rows are ~11 MB
ROWS_PER_CHUNK = 16_384


class TableSink(Protocol):
    """Receives each table's chunks in order (`append`), then reads them back (`chunks`) once `close`d."""

    def append(self, name: str, frame: pd.DataFrame) -> None:
        """Mutates. The next rows of table `name`; every chunk of a table has the same columns and dtypes."""
        ...

    def close(self) -> None:
        """Mutates. No more rows come; the tables are complete."""
        ...

    def chunks(self, name: str, columns: list[str]) -> Iterator[pd.DataFrame]:
        """The table's rows in order, in chunks, restricted to `columns` (after `close`)."""
        ...


class MemorySink:
    """Keeps every chunk in memory (a run's tables as DataFrames)."""

    def __init__(self) -> None:
        self._frames: dict[str, list[pd.DataFrame]] = {}

    def append(self, name: str, frame: pd.DataFrame) -> None:
        self._frames.setdefault(name, []).append(frame)

    def close(self) -> None:
        pass

    def chunks(self, name: str, columns: list[str]) -> Iterator[pd.DataFrame]:
        for frame in self._frames.get(name, []):
            yield frame[columns]

    def frame(self, name: str) -> pd.DataFrame:
        """The whole table (its chunks concatenated, index 0..n-1)."""
        frames = self._frames[name]
        if len(frames) == 1:
            return frames[0]
        return pd.concat(frames, ignore_index=True)


def close_quietly(writer: pq.ParquetWriter) -> None:
    """Close `writer` and its file whatever they raise (a full disk), and mark it closed so that its `__del__`
    does not try again."""
    for close in (writer.close, getattr(writer.file_handle, "close", None)):
        try:
            if close is not None:
                close()
        except (OSError, pa.ArrowException):
            pass
    writer.is_open = False


def write_frame(path: Path, frame: pd.DataFrame) -> None:
    """`frame.to_parquet(path, index=False)`, its writer closed at once if the write fails (see
    `ParquetSink.abandon`)."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    writer = pq.ParquetWriter(path, table.schema)
    try:
        writer.write_table(table)
        writer.close()
    except BaseException:
        close_quietly(writer)
        raise


class ParquetSink:
    """Writes `<directory>/<name>.parquet` one row group per chunk; holds no rows itself."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._writers: dict[str, pq.ParquetWriter] = {}

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.parquet"

    def append(self, name: str, frame: pd.DataFrame) -> None:
        table = pa.Table.from_pandas(frame, preserve_index=False)
        writer = self._writers.get(name)
        if writer is None:
            writer = self._writers[name] = pq.ParquetWriter(self.path(name), table.schema)
        elif not table.schema.equals(writer.schema, check_metadata=False):
            raise ValueError(f"table {name}: a chunk's columns {table.schema} differ from the first chunk's "
                             f"{writer.schema}")
        try:
            writer.write_table(table)
        except BaseException:
            self.abandon()
            raise

    def close(self) -> None:
        try:
            for writer in self._writers.values():
                writer.close()
        except BaseException:  # a full disk at the last flush: the other writers go too, quietly
            self.abandon()
            raise
        self._writers.clear()

    def abandon(self) -> None:
        """Mutates. Close every writer after a failed write, ignoring what each says about its own unwritten
        bytes; the files are incomplete and their directory is removed by the run's caller. A writer left to
        the garbage collector would instead retry its flush in `__del__` and print a traceback nobody can
        catch ("Exception ignored in: ParquetWriter.__del__") after the one clear error."""
        for writer in self._writers.values():
            close_quietly(writer)
        self._writers.clear()

    def chunks(self, name: str, columns: list[str]) -> Iterator[pd.DataFrame]:
        if self._writers:
            raise RuntimeError("ParquetSink.chunks before close: the files are not complete")
        file = pq.ParquetFile(self.path(name))
        for group in range(file.num_row_groups):
            yield file.read_row_group(group, columns=columns).to_pandas()
