"""How the command-line tools end when their reader goes away: quietly, like any Unix filter."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable


def quiet_broken_pipe(main: Callable[[], int]) -> int:
    """Run a CLI's `main`; when stdout's reader has closed (`... | head`), stop writing and return
    128 + SIGPIPE, the status a shell reports for a filter cut off that way, with no traceback."""
    try:
        status = main()
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null so that flush cannot fail too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
