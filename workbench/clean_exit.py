"""How the command-line tools end: usage errors in one line, and quietly when their reader goes away."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (what, and where to look), exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def quiet_broken_pipe(main: Callable[[], int]) -> int:
    """Run a CLI's `main`; when stdout's reader has closed (`... | head`), stop writing and return
    128 + SIGPIPE, the status a shell reports for a filter cut off that way, with no traceback. A Ctrl-C
    that `main` did not handle itself (while it imports) is one line and 130."""
    try:
        status = main()
        sys.stdout.flush()
        return status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
