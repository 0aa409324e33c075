"""Giving freed heap memory back to the operating system between the phases of a run.

glibc's malloc keeps freed memory in its heap for reuse, and after a large block is freed it serves
blocks up to that size from the heap instead of fresh mappings; so the transient arrays of a phase
(building a million-request workload: ~100 MB) stay in the process's resident memory for the rest of
the run. `release_free_memory` asks malloc to return what it holds free (`malloc_trim`), so a run's
peak is its largest phase, not the sum of every phase's leftovers. A no-op where malloc is not glibc's.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_libc = None


def release_free_memory() -> None:
    """Return the C heap's free memory to the operating system (glibc), else do nothing."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        _libc.malloc_trim(0)
