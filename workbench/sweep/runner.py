"""Run a sweep: every point into `OUT/points/<id>/` atomically, then `OUT/summary.parquet`.

A point is written into `OUT/points/.tmp-<id>-<random>/` and renamed to `OUT/points/<id>/` only
once the run has returned, so a point directory exists if and only if it is complete: a sweep
killed at any moment leaves finished points and temporary debris, never half a point. `resume`
skips the complete points and clears the debris; without it the sweep starts from an empty
`OUT/points/`. Only one sweep may write into a given OUT at a time.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from workbench.config import RunConfig
from workbench.sweep.executors import Executor, LocalExecutor
from workbench.sweep.spec import SweepSpec, describe
from workbench.sweep.summary import POINT_SUMMARY_FILE, summary_table, write_summary

POINTS_DIR = "points"
TMP_PREFIX = ".tmp-"

# run_fn(config, out_dir) writes the run files (docs/outputs.md) into out_dir; workbench.engine.run is the default
RunFn = Callable[[RunConfig, Path], Any]


class SweepError(RuntimeError):
    """A point failed; the points finished before it are kept (resume continues from them)."""


@dataclass(frozen=True)
class PointTask:
    point_id: str
    label: str  # "point 3 [<id>] (strategy=paged, block_size=16)", for errors
    config: dict[str, Any]
    points_dir: str
    run_fn: RunFn | None  # None: the engine; must be importable by name in the workers
    threads: int | None  # CPU threads for the run's parallel kernels (None: the library default)


def execute_point(task: PointTask) -> str:
    """Run one point into a temporary directory, then rename it into place. Returns the point id.

    Runs in a worker process. Writes only under `points_dir`.
    """
    if task.run_fn is None:
        from workbench.engine import run as run_fn
    else:
        run_fn = task.run_fn
    if task.threads is not None:
        limit_numba_threads(task.threads)
    points_dir = Path(task.points_dir)
    final = points_dir / task.point_id
    tmp = points_dir / f"{TMP_PREFIX}{task.point_id}-{uuid.uuid4().hex[:8]}"
    try:
        try:
            run_fn(RunConfig.from_dict(task.config), tmp)
        except Exception as exc:
            raise SweepError(f"{task.label} failed: {type(exc).__name__}: {exc}") from exc
        if not (tmp / POINT_SUMMARY_FILE).is_file():
            raise SweepError(f"{task.label}: the run wrote no {POINT_SUMMARY_FILE}")
        tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return task.point_id


def limit_numba_threads(threads: int) -> None:
    """Cap Numba's parallel threads in this worker: concurrent points each spawning one thread per
    core oversubscribe the machine and slow every parallel region down many times over."""
    if "numba" in sys.modules:
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    else:
        current = os.environ.get("NUMBA_NUM_THREADS")
        os.environ["NUMBA_NUM_THREADS"] = str(min(threads, int(current)) if current else threads)


def is_complete(points_dir: Path, point_id: str) -> bool:
    return (points_dir / point_id / POINT_SUMMARY_FILE).is_file()


def run_sweep(spec: SweepSpec, out_dir: str | Path, *, executor: Executor | None = None, resume: bool = False,
              progress: bool = True, run_fn: RunFn | None = None) -> pd.DataFrame:
    """Run every point of `spec` (skipping complete ones when `resume`) and write the summary.

    Mutates `out_dir`: creates `points/<id>/` per point and `summary.parquet`; without `resume`
    first removes an existing `points/` and summary. Returns the summary table.
    """
    out_dir = Path(out_dir)
    points_dir = out_dir / POINTS_DIR
    points = spec.points()
    if not resume and points_dir.exists():
        shutil.rmtree(points_dir)
        (out_dir / "summary.parquet").unlink(missing_ok=True)
    points_dir.mkdir(parents=True, exist_ok=True)
    for debris in points_dir.glob(TMP_PREFIX + "*"):
        shutil.rmtree(debris, ignore_errors=True)

    todo = [p for p in points if not is_complete(points_dir, p.point_id)]
    executor = executor or LocalExecutor()
    tasks = [PointTask(p.point_id, f"point {p.index} [{p.point_id}] ({describe(p.varied)})", p.config.to_dict(),
                       str(points_dir.resolve()), run_fn, executor.threads_per_task) for p in todo]
    bar = tqdm(total=len(points), initial=len(points) - len(todo), desc=spec.name, unit="point",
               file=sys.stderr, disable=not progress, dynamic_ncols=True)
    try:
        for _ in executor.map_unordered(execute_point, tasks):
            bar.update(1)
    finally:
        bar.close()
    table = summary_table(points, points_dir)
    write_summary(table, out_dir)
    return table

