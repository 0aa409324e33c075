"""One sweep at a time per output directory: a lock file `OUT/.lock` holding the owner's pid and host.

The file is created exclusively (O_EXCL), so of two sweeps starting together exactly one gets it.
A lock left by a process that no longer exists on this host (a sweep killed with SIGKILL) is stale
and taken over; a lock of a live process, or of another host (whose processes cannot be checked),
is refused with one line that says how to proceed.
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

LOCK_FILE = ".lock"


class SweepLocked(RuntimeError):
    """Another sweep holds the output directory."""


class SweepLock:
    """Context manager: holds `OUT/.lock` (creating OUT) from enter to exit."""

    def __init__(self, out_dir: Path) -> None:
        self.path = Path(out_dir) / LOCK_FILE
        self.token = f"{os.getpid()} {socket.gethostname()} {uuid.uuid4().hex}\n"

    def __enter__(self) -> SweepLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # a stale lock taken over by someone else in between: look again
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            with os.fdopen(fd, "w") as f:
                f.write(self.token)
            return self
        raise SweepLocked(f"{self.path.parent} is locked by another sweep ({self.path}); try again")

    def __exit__(self, *exc: object) -> None:
        try:
            if self.path.read_text() == self.token:
                self.path.unlink()
        except FileNotFoundError:
            pass

    def _take_over_if_stale(self) -> None:
        try:
            content = self.path.read_text()
        except FileNotFoundError:
            return
        owner = content.split()
        pid, host = (int(owner[0]), owner[1]) if len(owner) >= 2 and owner[0].isdigit() else (None, None)
        if pid is not None and host == socket.gethostname() and not _alive(pid):
            stale = self.path.with_name(f"{LOCK_FILE}.stale-{uuid.uuid4().hex[:8]}")
            try:
                os.rename(self.path, stale)  # atomic: of two processes taking over, one wins the rename
            except FileNotFoundError:
                return
            if stale.read_text() != content:  # a taker that came first already holds a fresh lock: give it back
                try:
                    os.link(stale, self.path)  # fails, keeping the newer one, if the path was taken again
                except FileExistsError:
                    pass
            stale.unlink()
            return
        who = f"pid {pid} on {host}" if pid is not None else "an unknown process"
        raise SweepLocked(f"{self.path.parent} is in use by another sweep ({who}); wait for it to finish, or "
                          f"delete {self.path} if that process is gone")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
