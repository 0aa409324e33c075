"""A `--force` sweep's old points: moved aside before it runs, removed when it completes, put back when it does not.

`--force` moves OUT's points and summary into `OUT/.tmp-replaced-<random>/` and removes that
directory only once the new sweep is complete. A forced sweep that fails or is interrupted puts
them back at once; one that is killed (SIGKILL, a power cut) leaves them aside, and the next sweep on
OUT (which holds the lock, so no live sweep owns them) puts them back before anything else. Putting
back is point by point: a replaced point returns to `OUT/points/` unless the interrupted sweep had
already written a new result for the same configuration (point ids are configuration hashes), which
is what `--force` asked for; the old summary returns when OUT has none.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from workbench.outdir import TMP_PREFIX
from workbench.sweep.layout import POINTS_DIR, SUMMARY_FILE

ASIDE_PREFIX = f"{TMP_PREFIX}replaced-"


def asides(out_dir: Path) -> list[Path]:
    """The replaced sweeps waiting in OUT, oldest name first."""
    return sorted(p for p in out_dir.glob(ASIDE_PREFIX + "*") if p.is_dir() and not p.is_symlink())


def move_aside(out_dir: Path) -> Path:
    """Mutates OUT: its points and summary into a new `OUT/.tmp-replaced-<random>/`, returned."""
    aside = out_dir / f"{ASIDE_PREFIX}{uuid.uuid4().hex[:8]}"
    aside.mkdir()
    for name in (POINTS_DIR, SUMMARY_FILE):
        if (out_dir / name).exists():
            os.rename(out_dir / name, aside / name)
    return aside


def put_back(out_dir: Path) -> str | None:
    """Mutates OUT: every replaced sweep aside goes back (see the module docstring) and its directory is
    removed. Returns one line saying what was put back, None when nothing was aside."""
    found = asides(out_dir)
    if not found:
        return None
    points_dir = out_dir / POINTS_DIR
    points_dir.mkdir(exist_ok=True)
    restored = superseded = 0
    for aside in found:
        old_points = aside / POINTS_DIR
        for point in sorted(old_points.iterdir()) if old_points.is_dir() else []:
            if point.name.startswith("."):  # a temporary of a run killed before the replacement
                shutil.rmtree(point, ignore_errors=True)
            elif (points_dir / point.name).exists():
                shutil.rmtree(point)
                superseded += 1
            else:
                os.rename(point, points_dir / point.name)
                restored += 1
        if (aside / SUMMARY_FILE).exists() and not (out_dir / SUMMARY_FILE).exists():
            os.rename(aside / SUMMARY_FILE, out_dir / SUMMARY_FILE)
        shutil.rmtree(aside)
    rerun = f", {superseded} kept the new result the --force sweep wrote for them" if superseded else ""
    return (f"{out_dir}: a --force sweep did not finish; {restored} of the points it was replacing are back in "
            f"{points_dir}{rerun}")


def discard(aside: Path) -> None:
    """The new sweep is complete: the replaced one goes."""
    shutil.rmtree(aside)
