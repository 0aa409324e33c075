"""Which code made a result: the package version and, in a git checkout, the commit.

A sweep point records both in its config.json (`version`, `git_commit`); `--resume` compares them with the
code that resumes (workbench.sweep.runner), since a point's id names its configuration, not the code."""

from __future__ import annotations

import subprocess

from workbench import __version__
from workbench.paths import IN_CHECKOUT, REPO_ROOT


def git_commit() -> str | None:
    """The checkout's HEAD commit; None for an installed wheel (even one inside another project's git
    repository, whose commit says nothing of this code) or without git."""
    if not IN_CHECKOUT:
        return None
    try:
        done = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def code_version() -> dict[str, str | None]:
    """The keys a run's config.json records about the code that made it."""
    return {"version": __version__, "git_commit": git_commit()}
