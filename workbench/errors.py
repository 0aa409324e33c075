"""The one error type for bad workload input: it names the file, line and field and what was expected."""

from __future__ import annotations


class WorkloadError(ValueError):
    """Bad workload input. `file` is a path or a spec string; `line` is 1-based (None when the problem is
    the file as a whole); `field` is the column or key (None when no single field is at fault)."""

    def __init__(self, file: str, line: int | None, field: str | None, expected: str, got: object = None):
        self.file = str(file)
        self.line = line
        self.field = field
        self.expected = expected
        self.got = got
        where = self.file if line is None else f"{self.file}:{line}"
        what = f"field {field!r}: " if field is not None else ""
        tail = "" if got is None else f", got {_short(got)}"
        super().__init__(f"{where}: {what}expected {expected}{tail}")


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class TraceError(RuntimeError):
    """A registry trace that cannot be had: unknown name, no download URL, network failure or a checksum
    mismatch. The message is one line that says what to do."""
