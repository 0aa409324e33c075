"""How the command-line tools end: every error one line, and output streams that fail never cost a result.

`run_cli(main)` is the entry of every `python -m workbench...` tool. It gives the tool standard
streams that cannot fail it: a closed descriptor 0, 1 or 2 is reopened on /dev/null (else the next
file opened, a result file, would take its number and receive whatever is written to it), and a
write to stdout or stderr that fails (a reader gone: `| head`; a full device: `> /dev/full`) is
remembered and the stream silenced, while the tool carries on to write its results. SIGTERM ends a
tool as Ctrl-C does (its cleanup runs), and `print_error` is how a tool reports: one line, at most
ERROR_CHARS long, whatever it is given.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn, TextIO

from workbench.errors import shortened

ERROR_CHARS = 1000  # a longer error line is cut in the middle: its start and end say what and what to do


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (what, and where to look), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {one_line(message)} (see {self.prog} --help)\n")


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: handled wherever Ctrl-C is (workers stopped, temporaries removed, locks released)."""


def one_line(message: object) -> str:
    return shortened(" ".join(str(message).split()), ERROR_CHARS)


def print_error(message: object) -> None:
    """`error: <message>` on stderr as one line of at most ERROR_CHARS characters."""
    print(f"error: {one_line(message)}", file=sys.stderr)


class GuardedStream:
    """A text stream whose first failed write or flush is kept in `error` instead of raised; its descriptor
    then points at /dev/null, so nothing written later (nor Python's flush at exit) fails again."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.error: OSError | None = None

    def write(self, text: str) -> int:
        if self.error is None:
            try:
                return self._stream.write(text)
            except OSError as exc:
                self._fail(exc)
        return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            if self.error is None:
                self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        self.error = exc
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
            self._stream.flush()  # what was buffered goes to /dev/null now
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def run_cli(main: Callable[[], int]) -> int:
    """Run a CLI's `main` with guarded streams; returns its exit status. A failed stdout turns a success into
    128 + SIGPIPE when the reader went away (what a shell reports for `... | head`, said nowhere) or 1
    with one line on stderr for any other failure; the results the tool wrote are kept either way. Ctrl-C
    or SIGTERM that `main` did not handle itself (while it imports) is one line and 130."""
    _reopen_closed_descriptors()
    out, err = GuardedStream(sys.stdout), GuardedStream(sys.stderr)
    sys.stdout, sys.stderr = out, err
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        status = main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        status = 128 + signal.SIGINT
    out.flush()
    if out.error is None or status != 0:
        return status
    if out.error.errno == errno.EPIPE:
        return 128 + signal.SIGPIPE
    print_error(f"cannot write to standard output: {out.error.strerror or out.error}; what the command wrote to "
                f"files is complete")
    return 1


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


def _reopen_closed_descriptors() -> None:
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)  # the lowest free number: this one
    if sys.stdout is None:  # Python found descriptor 1 closed at startup
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - lives as long as the process
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
