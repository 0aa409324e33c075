"""Result directories are never destroyed by accident (docs/outputs.md).

A result is written into a temporary sibling (`.tmp-<name>-<pid>-<random>`) and renamed into place
once complete, so a result directory exists only when whole. An existing result is refused unless
the caller asked to replace it; then the old one is moved aside only after the new one is complete
and removed only after the new one is in place, so a failure at any moment loses neither.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

TMP_PREFIX = ".tmp-"


class OutputExistsError(ValueError):
    """The output directory already holds results and the caller did not ask to replace them."""


def staging_dir(final: Path) -> Path:
    """A fresh temporary sibling of `final` (not created); its name starts with TMP_PREFIX."""
    return final.with_name(f"{TMP_PREFIX}{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def holds_results(path: Path) -> bool:
    """True when `path` is a file or a non-empty directory."""
    if path.is_dir():
        return any(path.iterdir())
    return path.exists()


def resolve_path(path: Path, flag: str) -> Path:
    """The absolute path an argument names, every symbolic link followed: a link to a directory is that
    directory, a dangling link the path it points to. Results are renamed into place and replaced
    copies moved aside, which would act on a link itself, not on what it names; so every path
    argument is resolved once, before any work. Raises ValueError (one line) for a link loop."""
    try:
        return Path(path).expanduser().resolve()
    except (OSError, RuntimeError) as exc:  # ELOOP: "Too many levels of symbolic links"
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "symbolic link loop"
        raise ValueError(f"{flag} {path}: {reason}") from None


def check_target(final: Path, *, replace: bool, flag: str = "--out", hint: str = "pass --force to replace it") -> Path:
    """Before any work: the resolved `final` (`resolve_path`); raises ValueError (one line) when it holds
    results and `replace` is off, or when it could not be created. Creates nothing: writability is
    probed with a directory made and removed in the nearest existing ancestor."""
    final = resolve_path(final, flag)
    if final.exists() and not final.is_dir():
        raise ValueError(f"{flag} {final}: exists and is not a directory")
    if holds_results(final) and not replace:
        raise OutputExistsError(f"{flag} {final} already holds results; {hint}")
    ancestor = final.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{flag} {final}: {ancestor} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(dir=ancestor, prefix=TMP_PREFIX + "probe-"))
    except OSError as exc:
        raise ValueError(f"{flag} {final}: cannot create it in {ancestor}: {exc.strerror}") from None
    return final


def install(staged: Path, final: Path, *, replace: bool) -> None:
    """Rename the complete directory `staged` to `final`. When `final` holds results, raise
    OutputExistsError (naming `staged`, which is kept) unless `replace`: then the old directory is
    moved aside, the new one renamed in (the old one put back if that fails), and the old one removed."""
    final.parent.mkdir(parents=True, exist_ok=True)
    aside = None
    if holds_results(final):
        if not replace:
            raise OutputExistsError(f"{final} already holds results; the new ones are kept in {staged}")
        aside = final.with_name(f"{TMP_PREFIX}{final.name}-replaced-{uuid.uuid4().hex[:8]}")
        os.rename(final, aside)
    elif final.is_dir():
        final.rmdir()  # an empty directory, e.g. made by the user beforehand
    try:
        os.rename(staged, final)
    except OSError:
        if aside is not None:
            os.rename(aside, final)
        raise
    if aside is not None:
        shutil.rmtree(aside)
