"""Finding a registry trace on disk: the local cache, then the shared traces folder, then a download
that is size-capped and checksum-verified (and, for derived files, derived and verified again) before
it lands in the cache, so the cache only ever holds verified files."""

from __future__ import annotations

import hashlib
import http.client
import io
import os
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tqdm import tqdm

from workbench.errors import TraceError
from workbench.paths import open_regular, shared_traces_dir
from workbench.traces.derive import DERIVATIONS
from workbench.traces.registry import TraceEntry, get_trace

CACHE_ENV = "WORKBENCH_TRACE_CACHE"
_CHUNK_BYTES = 1 << 16


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


def locate(name: str) -> Path | None:
    """The trace's file when it is already here (a verified cache copy, else the shared folder's), without
    any download; None otherwise."""
    entry = get_trace(name)
    cached = cached_path(entry)
    if _is_verified(cached, entry):
        return cached
    return shared_path(entry)


def resolve(name: str) -> Path:
    """Path of the trace file: a verified cache copy, else the shared folder's, else a fresh download."""
    return locate(name) or fetch(name)


def fetch(name: str, url: str | None = None, timeout_s: float = 60.0, progress: bool = True) -> Path:
    """Download the trace into the cache (from `url` when given, else the registry's) and return its path.

    The download may bring at most the registry's size of the published file and must match its sha256;
    a derived trace is then derived from it and must match the registry's sha256 again. The result goes
    to a temporary file beside the destination and is renamed into place, so on any failure nothing is
    left behind. A verified copy already in the cache is returned without downloading. `progress` shows
    a progress bar on a terminal.
    """
    entry = get_trace(name)
    url = url or entry.url
    dest = cached_path(entry)
    if _is_verified(dest, entry):
        return dest
    published = _download(entry, url, timeout_s, progress)
    data = published if entry.derive is None else DERIVATIONS[entry.derive](published)
    if entry.derive is not None and _sha256(data) != entry.sha256:
        raise TraceError(f"trace {name!r}: deriving it ({entry.derive}) from {url} gave sha256 {_sha256(data)}, "
                         f"expected {entry.sha256}; nothing was written")
    made_folder = not dest.parent.exists()
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{entry.file_name}.", suffix=".part")
    except OSError as exc:
        raise TraceError(f"the trace cache {cache_dir()} is unusable ({exc.strerror}: {exc.filename}); "
                         f"set ${CACHE_ENV} to a writable folder") from None
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, dest)
    except OSError as exc:
        raise TraceError(f"cannot write trace {name!r} into {dest.parent}: {exc}; nothing was written") from None
    finally:
        tmp.unlink(missing_ok=True)
        if made_folder and not dest.exists():
            dest.parent.rmdir()
    return dest


def _is_verified(path: Path, entry: TraceEntry) -> bool:
    """True when `path` holds the registry's bytes; an unreadable cache counts as empty."""
    kind, expected = _pin(entry.sha256, entry)
    try:
        return path.is_file() and _file_digest(kind, path) == expected
    except OSError:
        return False


def _open_url(url: str, timeout_s: float):
    """A readable response for `url`. A `file:` URL's path is opened by `paths.open_regular`, never by urllib,
    which would open a FIFO nobody writes and wait for ever (its `timeout` covers sockets only)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return open_regular(urllib.request.url2pathname(parsed.path))
    return urllib.request.urlopen(url, timeout=timeout_s)


def _download(entry: TraceEntry, url: str, timeout_s: float, progress: bool) -> bytes:
    """The published file's bytes, refused when larger than the registry says or when its sha256 (or git
    blob id) differs."""
    cap_bytes = entry.download_size_bytes
    buffer = io.BytesIO()
    try:
        with _open_url(url, timeout_s) as response:
            announced = response.headers.get("Content-Length") if hasattr(response, "headers") else None
            if announced is not None and int(announced) > cap_bytes:
                raise TraceError(f"trace {entry.name!r} at {url} is {int(announced):,} bytes, more than the "
                                 f"registry's {cap_bytes:,}; nothing was written")
            total = None if entry.size_bytes is None else cap_bytes  # unknown size: a count, not a bar
            with tqdm(total=total, unit="B", unit_scale=True, desc=entry.name, file=sys.stderr,
                      disable=None if progress else True, leave=False) as bar:
                while chunk := response.read(_CHUNK_BYTES):
                    buffer.write(chunk)
                    bar.update(len(chunk))
                    if buffer.tell() > cap_bytes:
                        raise TraceError(f"trace {entry.name!r} at {url} is larger than the registry's "
                                         f"{cap_bytes:,} bytes; nothing was written")
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        raise TraceError(f"cannot download trace {entry.name!r} from {url}: {exc}; nothing was written") from None
    data = buffer.getvalue()
    kind, expected = _pin(entry.download_sha256, entry)
    got = _sha256(data) if kind == "sha256" else _git_blob_sha1(data)
    if got != expected:
        raise TraceError(f"checksum mismatch for trace {entry.name!r} from {url}: expected {kind} {expected}, "
                         f"got {got}; nothing was written")
    return data


def _pin(sha256: str | None, entry: TraceEntry) -> tuple[str, str]:
    """(kind, hex) that bytes must hash to: `sha256` when the registry knows it, else the entry's git blob id."""
    return ("sha256", sha256) if sha256 is not None else ("git blob id", entry.git_blob_sha1)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _git_blob_sha1(data: bytes) -> str:
    """Git's object id of a file with these bytes (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def git_blob_sha1_of(path: Path) -> str:
    """Git's object id of the file at `path`, read in chunks."""
    return _digest_file(hashlib.sha1(b"blob %d\0" % path.stat().st_size, usedforsecurity=False), path)


def sha256_of(path: Path) -> str:
    return _digest_file(hashlib.sha256(), path)


def _file_digest(kind: str, path: Path) -> str:
    """The file's "sha256" or "git blob id"."""
    return sha256_of(path) if kind == "sha256" else git_blob_sha1_of(path)


def _digest_file(digest, path: Path) -> str:
    """`digest` (a hashlib object) fed the file's bytes in chunks, as hex."""
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
