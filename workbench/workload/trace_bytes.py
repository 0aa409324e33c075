"""A trace file's bytes, by content: compression is recognised from the first bytes, never the name.

pandas guesses a compression from a file's suffix (`.zip`, `.xz`, `.tar`, `.zst`), so a CSV that
happens to be named so fails inside a decompressor, and a compressed file named `.csv` is parsed as
garbage. Here gzip, bzip2 and xz (the Python standard library's) are read whatever the name; zstd,
zip, 7-Zip and tar are refused in one line that says how to unpack them. A file, or what it
decompresses to, larger than MAX_TRACE_BYTES is refused before it fills the memory.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import zlib
from pathlib import Path

from workbench.errors import WorkloadError
from workbench.paths import open_regular

MAX_TRACE_BYTES = 4 << 30  # the published traces are at most a few hundred MB uncompressed

_READABLE = ((b"\x1f\x8b", "gzip", gzip.open), (b"BZh", "bzip2", bz2.open), (b"\xfd7zXZ\x00", "xz", lzma.open))
_REFUSED = ((b"\x28\xb5\x2f\xfd", "zstd-compressed", "zstd -d"), (b"PK\x03\x04", "a zip archive", "unzip"),
            (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", "7z x"))
_TAR_MAGIC_OFFSET = 257  # POSIX tar: "ustar" in the first header block


def read_trace_bytes(path: Path) -> bytes:
    """The file's content, decompressed when it is gzip, bzip2 or xz. Raises WorkloadError (naming the
    file) for a missing, unreadable, archived, zstd-compressed, corrupt or oversized file."""
    try:
        with open_regular(path) as f:  # a FIFO or a device is refused, never waited on
            head = f.read(_TAR_MAGIC_OFFSET + 5)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise WorkloadError(path, None, None, "an existing file") from None
    except OSError as exc:
        raise WorkloadError(path, None, None, "a readable file", exc.strerror) from None
    for magic, kind, unpack in _REFUSED:
        if head.startswith(magic):
            raise WorkloadError(path, None, None, f"a trace as text, gzip, bzip2 or xz; this file is {kind} "
                                f"(unpack it first: {unpack})")
    if head[_TAR_MAGIC_OFFSET:_TAR_MAGIC_OFFSET + 5] == b"ustar":
        raise WorkloadError(path, None, None, "a trace as text, gzip, bzip2 or xz; this file is a tar archive "
                            "(unpack it first: tar -xf)")
    for magic, kind, opener in _READABLE:
        if head.startswith(magic):
            return _decompress(path, kind, opener)
    if size > MAX_TRACE_BYTES:
        raise WorkloadError(path, None, None, f"a trace of at most {MAX_TRACE_BYTES:,} bytes", f"{size:,} bytes")
    try:
        with open_regular(path) as f:
            return f.read()
    except OSError as exc:
        raise WorkloadError(path, None, None, "a readable file", exc.strerror) from None


def _decompress(path: Path, kind: str, opener) -> bytes:
    try:
        with open_regular(path) as raw, opener(raw, "rb") as f:
            data = f.read(MAX_TRACE_BYTES + 1)
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as exc:
        raise WorkloadError(path, None, None, f"a complete {kind} file", str(exc) or type(exc).__name__) from None
    if len(data) > MAX_TRACE_BYTES:
        raise WorkloadError(path, None, None, f"a trace of at most {MAX_TRACE_BYTES:,} bytes once decompressed")
    return data
