"""Errors for bad input (each names where and what was expected), and `shown`: a user's value in a message."""

from __future__ import annotations

import reprlib

# A value a user gave is shown at most this long in a message: the value may be huge (a YAML alias
# expanded, a trace line of megabytes), and the message is one line on a terminal.
SHOWN_CHARS = 60
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = SHOWN_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 4
_REPR.maxlevel = 3


def shortened(text: str, limit: int = 200) -> str:
    """Plain text a user gave (a path, a workload spec) cut in the middle to at most `limit` characters."""
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


def shown(value: object) -> str:
    """`repr(value)` cut to SHOWN_CHARS, at a cost bounded whatever the value's size: containers are
    walked only as far as what is shown, and an integer of thousands of digits is never converted."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4 * SHOWN_CHARS:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = _REPR.repr(value)
    except (ValueError, RecursionError):  # a nested integer too long to convert, a self-containing list
        return f"a {type(value).__name__}"
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


class WorkloadError(ValueError):
    """Bad workload input. `file` is a path or a spec string; `line` is 1-based (None when the problem is
    the file as a whole); `field` is the column or key (None when no single field is at fault)."""

    def __init__(self, file: str, line: int | None, field: str | None, expected: str, got: object = None):
        self.file = str(file)
        self.line = line
        self.field = field
        self.expected = expected
        self.got = got
        where = shortened(self.file) if line is None else f"{shortened(self.file)}:{line}"
        what = f"field {field!r}: " if field is not None else ""
        tail = "" if got is None else f", got {shown(got)}"
        super().__init__(f"{where}: {what}expected {expected}{tail}")


class TraceError(RuntimeError):
    """A registry trace that cannot be had: unknown name, no download URL, network failure or a checksum
    mismatch. The message is one line that says what to do."""


class UnservableError(ValueError):
    """The run's configuration can serve no request of its workload, so it would measure nothing; the
    message names the request tried and why it is refused."""


class ConfigError(ValueError):
    """A run or sweep that cannot start as asked: a bad flag, a contradictory combination, a workload the
    configuration cannot serve, or an output directory that must not be touched. The message is the line
    the command-line tools print after `error: `."""


class ResultError(ValueError):
    """A result directory (a run's `--out`, a sweep's point) that cannot be read back. `name` is the file at
    fault (`summary.json`), `problem` what is wrong with it and what was expected (`lacks kv_slots`); the
    message is the file's path and the problem."""

    def __init__(self, folder: object, name: str, problem: str):
        self.name = name
        self.problem = problem
        super().__init__(f"{shortened(str(folder))}/{name} {problem}")
