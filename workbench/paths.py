"""Where the workbench finds things outside the package: the repository root and shared traces."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent  # meaningful in a source checkout only
IN_CHECKOUT = (REPO_ROOT / "pyproject.toml").is_file()  # False for an installed wheel (site-packages)


def pythonpath_with_package() -> str:
    """$PYTHONPATH with the folder holding this package first: a child process given it imports this package,
    installed or a source tree, ahead of any other copy."""
    return os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))


def shared_traces_dir() -> Path | None:
    """`../shared/traces` beside the checkout (or $WORKBENCH_SHARED_TRACES), None when absent."""
    candidates = []
    if os.environ.get("WORKBENCH_SHARED_TRACES"):
        candidates.append(Path(os.environ["WORKBENCH_SHARED_TRACES"]))
    candidates += [REPO_ROOT.parent / "shared" / "traces", Path.cwd().parent / "shared" / "traces"]
    for path in candidates:
        if path.is_dir():
            return path
    return None


def runs_dir() -> Path:
    """Where sweeps go when no output directory is named: $WORKBENCH_RUNS_DIR, else `runs` in the working
    directory."""
    return Path(os.environ.get("WORKBENCH_RUNS_DIR") or "runs")


class NotRegularFileError(OSError):
    """A path that names a FIFO, a directory, a device or a socket where a file's bytes are expected."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(errno.EINVAL, "not a regular file", str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """`path` opened for reading in binary, refused unless it is a regular file, without ever waiting: the
    open is non-blocking, so a FIFO nobody writes (or a terminal, a device) returns at once and is then
    refused by its kind, where a plain `open` would wait forever. Raises OSError (its `strerror` says why);
    every user-named file the workbench reads goes through here."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFileError(path)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
