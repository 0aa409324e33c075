"""A disk that fills while a table is written is one error, raised where it happened: every Parquet writer is
closed then, so none is left for the garbage collector, whose `__del__` would flush again, fail again and print
a traceback nobody can catch ("Exception ignored in: ParquetWriter.__del__"). The disk fills at every write
and at every close of a run's two tables in turn; a full disk fails every later flush too."""

from __future__ import annotations

import errno
import gc
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from workbench import table_sink
from workbench.table_sink import ParquetSink, write_frame

REAL_WRITER = pq.ParquetWriter
CHUNKS = 3


class Disk:
    """Counts the writes and closes; from call `full_at` on, every one fails as a full disk does."""

    def __init__(self, full_at: int) -> None:
        self.full_at, self.calls, self.writers = full_at, 0, []

    def check(self) -> None:
        self.calls += 1
        if self.calls > self.full_at:
            raise OSError(errno.ENOSPC, "No space left on device")

    def writer(self, where, schema, **kw):
        disk = self

        class OnThisDisk(REAL_WRITER):
            def write_table(self, table, *args, **kwargs):
                disk.check()
                return super().write_table(table, *args, **kwargs)

            def close(self):
                if self.is_open:
                    disk.check()
                return super().close()

        writer = OnThisDisk(where, schema, **kw)
        self.writers.append(writer)
        return writer


@pytest.fixture
def unraisable(monkeypatch):
    """What reaches sys.unraisablehook (an "Exception ignored in" report), after a garbage collection."""
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda event: seen.append(f"{event.object!r}: {event.exc_value!r}"))

    def collected():
        gc.collect()
        return seen

    return collected


def frame(rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"step": np.arange(rows), "t_s": rng.random(rows), "status": ["finished"] * rows})


def streamed(folder) -> None:
    sink = ParquetSink(folder)
    for chunk in range(CHUNKS):  # two tables, chunk after chunk, then both closed
        sink.append("steps", frame(200, chunk))
        sink.append("requests", frame(20, chunk))
    sink.close()


def whole(folder) -> None:
    write_frame(folder / "steps.parquet", frame(2_000, 1))


@pytest.mark.parametrize("write,calls", [(streamed, 2 * CHUNKS + 2), (whole, 2)], ids=["streamed", "whole"])
def test_a_disk_full_at_any_write_is_one_error_and_every_writer_is_closed(tmp_path, monkeypatch, unraisable,
                                                                          write, calls):
    for full_at in range(calls):
        disk = Disk(full_at)
        monkeypatch.setattr(table_sink.pq, "ParquetWriter", disk.writer)
        folder = tmp_path / f"full-at-{full_at}"
        folder.mkdir()
        with pytest.raises(OSError, match="No space left on device"):
            write(folder)
        assert disk.writers and not any(w.is_open for w in disk.writers), full_at
        del disk
        assert unraisable() == [], full_at
    monkeypatch.setattr(table_sink.pq, "ParquetWriter", Disk(calls).writer)
    write(tmp_path)  # room for every call: written


def test_a_whole_table_reads_back_as_to_parquet_writes_it(tmp_path):
    table = frame(1_000, 2)
    write_frame(tmp_path / "a.parquet", table)
    table.to_parquet(tmp_path / "b.parquet", index=False)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a.parquet"), pd.read_parquet(tmp_path / "b.parquet"))
    assert pq.read_schema(tmp_path / "a.parquet").equals(pq.read_schema(tmp_path / "b.parquet"), check_metadata=True)
