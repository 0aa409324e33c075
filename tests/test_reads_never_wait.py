"""Every file a user names is opened without waiting and refused unless it is a regular file: a FIFO nobody
writes, a directory or a character device where a trace, a sweep spec, a result file or a `file://` download
is expected is one error naming it, never a hang (the `file://` download's test is in tests/traces). A
watchdog turns a hang into a failure."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path

import pytest

import workbench as wb
from tests.api.test_public_api import TINY
from workbench.errors import ResultError, WorkloadError
from workbench.paths import open_regular
from workbench.sweep.spec import SpecError, load_spec
from workbench.workload.trace_bytes import read_trace_bytes

WATCHDOG_S = 20


@contextlib.contextmanager
def watchdog():
    def hung(_signum, _frame):
        raise TimeoutError("a read waited on a file that is not a regular one")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(WATCHDOG_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def make(kind: str, path: Path) -> Path:
    """A thing of `kind` at `path` that is not a regular file."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")  # a character device that never ends
    return path


KINDS = ("fifo", "directory", "device")


@pytest.mark.parametrize("kind", KINDS)
def test_open_regular_refuses_what_is_not_a_regular_file(tmp_path, kind):
    with watchdog(), pytest.raises(OSError, match="not a regular file|Is a directory"):
        open_regular(make(kind, tmp_path / "thing"))


@pytest.mark.parametrize("kind", KINDS)
def test_a_trace_file(tmp_path, kind):
    with watchdog(), pytest.raises(WorkloadError, match=str(tmp_path / "trace.csv")):
        read_trace_bytes(make(kind, tmp_path / "trace.csv"))


@pytest.mark.parametrize("kind", KINDS)
def test_a_sweep_spec(tmp_path, kind):
    with watchdog(), pytest.raises(SpecError, match=str(tmp_path / "spec.yaml")):
        load_spec(make(kind, tmp_path / "spec.yaml"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["config.json", "summary.json", "steps.parquet"])
def test_a_result_file(tmp_path, kind, name):
    folder = tmp_path / "run"
    wb.run(**TINY).save(folder)
    (folder / name).unlink()
    make(kind, folder / name)
    with watchdog(), pytest.raises(ResultError, match=f"{name} is unreadable"):
        wb.load(folder)
    shutil.rmtree(folder)
