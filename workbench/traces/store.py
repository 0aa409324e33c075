"""Finding a registry trace on disk: the local cache, then the shared traces folder, then a download
that is checksum-verified before it lands in the cache (so the cache only ever holds verified files)."""

from __future__ import annotations

import hashlib
import http.client
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from workbench.errors import TraceError
from workbench.paths import shared_traces_dir
from workbench.traces.registry import TraceEntry, get_trace

CACHE_ENV = "WORKBENCH_TRACE_CACHE"
_CHUNK_BYTES = 1 << 20


def cache_dir() -> Path:
    """$WORKBENCH_TRACE_CACHE, default ~/.cache/kv-workbench/traces."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "kv-workbench" / "traces"


def cached_path(entry: TraceEntry) -> Path:
    return cache_dir() / entry.name / entry.file_name


def shared_path(entry: TraceEntry) -> Path | None:
    folder = shared_traces_dir()
    if folder is None:
        return None
    path = folder / entry.folder / entry.file_name
    return path if path.is_file() else None


def resolve(name: str) -> Path:
    """Path of the trace file: a verified cache copy, else the shared folder's, else a fresh download."""
    entry = get_trace(name)
    cached = cached_path(entry)
    if _is_verified(cached, entry):
        return cached
    shared = shared_path(entry)
    if shared is not None:
        return shared
    return fetch(name)


def fetch(name: str, url: str | None = None, timeout_s: float = 60.0) -> Path:
    """Download the trace into the cache (from `url` when given, else the registry's) and return its path.

    The bytes go to a temporary file beside the destination and are renamed into place only when their
    sha256 matches the registry; on any failure nothing is left behind. A verified copy already in the
    cache is returned without downloading.
    """
    entry = get_trace(name)
    url = url or entry.url
    if url is None:
        raise TraceError(f"trace {name!r} has no download URL: it was derived from {entry.source}; "
                         f"its copy lives in the shared traces folder ({entry.folder}/{entry.file_name})")
    dest = cached_path(entry)
    if _is_verified(dest, entry):
        return dest
    made_folder = not dest.parent.exists()
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{entry.file_name}.", suffix=".part")
    except OSError as exc:
        raise TraceError(f"the trace cache {cache_dir()} is unusable ({exc.strerror}: {exc.filename}); "
                         f"set ${CACHE_ENV} to a writable folder") from None
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout_s) as response:
            while chunk := response.read(_CHUNK_BYTES):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != entry.sha256:
            raise TraceError(f"checksum mismatch for trace {name!r} from {url}: expected sha256 {entry.sha256}, "
                             f"got {digest.hexdigest()}; nothing was written")
        os.replace(tmp, dest)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        raise TraceError(f"cannot download trace {name!r} from {url}: {exc}; nothing was written") from None
    finally:
        tmp.unlink(missing_ok=True)
        if made_folder and not dest.exists():
            dest.parent.rmdir()
    return dest


def _is_verified(path: Path, entry: TraceEntry) -> bool:
    """True when `path` holds the registry's bytes; an unreadable cache counts as empty."""
    try:
        return path.is_file() and sha256_of(path) == entry.sha256
    except OSError:
        return False


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
