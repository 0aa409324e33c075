"""Run a sweep: every point into `OUT/points/<id>/` atomically, then `OUT/summary.parquet`.

A point is written into `OUT/points/.tmp-<id>-<pid>-<random>/` and renamed to `OUT/points/<id>/`
only once the run has returned, so a point directory exists if and only if it is complete: a sweep
killed at any moment leaves finished points and temporary debris, never half a point. Nothing a
user has is lost: an OUT that already holds a sweep is refused unless `resume` (keep its valid
points, run the rest) or `force` (start over; the old points are moved aside and removed only when
the new sweep has finished; put back if it does not: `workbench.sweep.replaced`). `resume` checks
every kept point (its four files, a summary whose figures are numbers where numbers belong, a
config whose hash is the point id) and moves a broken one to `OUT/broken/` before running it
again; a point that other code made (its config.json records another package version or git commit)
goes to `OUT/stale/` and runs again, unless `reuse_stale`. A lock file keeps a second sweep out of the
same OUT while one runs. OUT and the entries the sweep manages in it are checked before any work: each
must be of its kind (a directory, a file).
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from workbench.arguments import count_argument, switch_argument, text_argument
from workbench.code_version import code_version
from workbench.config import RunConfig
from workbench.errors import ConfigError, ResultError, shown
from workbench.experiments import find_experiment
from workbench.outdir import TMP_PREFIX, OutputExistsError, check_target, install, staging_dir
from workbench.paths import runs_dir
from workbench.result_dir import check_table, read_config, read_summary
from workbench.sweep.executors import Executor, LocalExecutor, make_executor
from workbench.sweep.layout import POINT_SUMMARY_FILE, POINTS_DIR, SUMMARY_FILE
from workbench.sweep.lock import LOCK_FILE, SweepLock
from workbench.sweep.replaced import asides, discard, move_aside, put_back
from workbench.sweep.spec import MAX_POINTS, Point, SweepSpec, config_id, describe, load_spec, parse_spec
from workbench.sweep.summary import summary_table, write_summary

BROKEN_DIR = "broken"
STALE_DIR = "stale"  # points made by other code, set aside by a resume that runs them again

# run_fn(config, out_dir) writes the run files (docs/outputs.md) into out_dir; engine.simulation.run is the default
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
        from workbench.engine.simulation import run as run_fn
    else:
        run_fn = task.run_fn
    if task.threads is not None:
        limit_numba_threads(task.threads)
    final = Path(task.points_dir) / task.point_id
    tmp = staging_dir(final)
    try:
        try:
            run_fn(RunConfig.from_dict(task.config), tmp)
        except Exception as exc:
            raise SweepError(f"{task.label} failed: {type(exc).__name__}: {exc}") from exc
        if not (tmp / POINT_SUMMARY_FILE).is_file():
            raise SweepError(f"{task.label}: the run wrote no {POINT_SUMMARY_FILE}")
        install(tmp, final, replace=False)
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


def point_problem(points_dir: Path, point: Point) -> str | None:
    """Why the point directory cannot be kept (None when it is complete and belongs to `point`)."""
    folder = points_dir / point.point_id
    try:
        _, stored = read_config(folder)
        read_summary(folder)
        for table in ("steps.parquet", "requests.parquet"):
            check_table(folder, table)
    except ResultError as exc:
        return f"{exc.name} {exc.problem}"
    if config_id(stored) != point.point_id:
        return "its config.json describes another configuration"
    return None


def holds_sweep(out_dir: Path) -> bool:
    """A summary, a point, or the points of a --force sweep that did not finish."""
    points_dir = out_dir / POINTS_DIR
    return (out_dir / SUMMARY_FILE).exists() or bool(asides(out_dir)) or (points_dir.is_dir() and any(
        not p.name.startswith(".") for p in points_dir.iterdir()))


# what the sweep itself creates in OUT, and the kind each must be
OUT_ENTRIES = {POINTS_DIR: stat.S_ISDIR, BROKEN_DIR: stat.S_ISDIR, STALE_DIR: stat.S_ISDIR, LOCK_FILE: stat.S_ISREG,
               SUMMARY_FILE: stat.S_ISREG}


def check_out_dir(out_dir: Path, *, resume: bool, force: bool) -> Path:
    """Before any work: OUT resolved (`outdir.resolve_path`). Raises ValueError (one line) when OUT holds a
    sweep and neither `resume` nor `force` says what to do with it, when OUT cannot be created, or when
    an entry the sweep manages in it is not of its kind (a symbolic link included)."""
    if resume and force:
        raise ValueError("--resume keeps the points in OUT and --force replaces them: choose one")
    out_dir = check_target(out_dir, replace=True)
    for name, is_kind in OUT_ENTRIES.items():
        try:
            mode = os.lstat(out_dir / name).st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ValueError(f"--out {out_dir}: cannot inspect {name}: {exc.strerror}") from None
        if not is_kind(mode):
            kind = "a directory" if is_kind is stat.S_ISDIR else "a regular file"
            raise ValueError(f"--out {out_dir}: {out_dir / name} is not {kind}; the sweep keeps its {name} there, "
                             f"move it away")
    if holds_sweep(out_dir) and not (resume or force):
        raise OutputExistsError(f"--out {out_dir} already holds a sweep; pass --resume to continue it or --force "
                                f"to replace it")
    return out_dir


def run_sweep(spec: SweepSpec, out_dir: str | Path, *, executor: Executor | None = None, resume: bool = False,
              force: bool = False, reuse_stale: bool = False, progress: bool = True,
              run_fn: RunFn | None = None) -> pd.DataFrame:
    """Run every point of `spec` (with `resume`, only those OUT lacks) and write the summary.

    A point kept by `resume` must also have been made by this code (the package version and git commit its
    config.json records); one made by other code is moved to `OUT/stale/` and run again, unless
    `reuse_stale`. Mutates `out_dir`: creates `points/<id>/` per point and `summary.parquet`. Raises ValueError
    before any work when OUT holds a sweep and neither `resume` nor `force` is given, SweepLocked
    when another sweep holds OUT, SweepError when a point fails. Returns the summary table.
    """
    out_dir = check_out_dir(Path(out_dir), resume=resume, force=force)
    points = spec.points()
    with SweepLock(out_dir):
        points_dir = out_dir / POINTS_DIR
        _say(put_back(out_dir))  # a --force sweep killed earlier: the lock says it is not running
        replaced = move_aside(out_dir) if force and holds_sweep(out_dir) else None
        points_dir.mkdir(parents=True, exist_ok=True)
        for debris in points_dir.glob(TMP_PREFIX + "*"):  # temporaries of killed runs; the lock says none is live
            shutil.rmtree(debris, ignore_errors=True)
        if resume:
            kept = [p for p in points if _keep(out_dir, p)]
            if not reuse_stale:
                _say(set_aside_stale(out_dir, kept, len(points)))
            todo = [p for p in points if not (points_dir / p.point_id).exists()]
        else:
            todo = points
        executor = executor or LocalExecutor()
        tasks = [PointTask(p.point_id, f"point {p.index} [{p.point_id}] ({describe(p.varied)})",
                           p.config.to_dict(), str(points_dir.resolve()), run_fn, executor.threads_per_task)
                 for p in todo]
        bar = tqdm(total=len(points), initial=len(points) - len(todo), desc=spec.name, unit="point",
                   file=sys.stderr, disable=not progress, dynamic_ncols=True)
        try:
            for _ in executor.map_unordered(execute_point, tasks):
                bar.update(1)
        except BaseException:
            if replaced is not None:
                _say(put_back(out_dir))
            raise
        finally:
            bar.close()
        table = summary_table(points, points_dir)
        write_summary(table, out_dir)
        if replaced is not None:
            discard(replaced)
    return table


def load_sweep_spec(spec: SweepSpec | Mapping[str, Any] | str | Path, *,
                    max_points: int | None = MAX_POINTS) -> SweepSpec:
    """A sweep spec from a parsed spec, a mapping (the YAML document as data), a YAML file or the name of
    a built-in experiment. Raises SpecError (a ValueError) naming the key at fault."""
    if isinstance(spec, SweepSpec):
        return spec
    if isinstance(spec, Mapping):
        return parse_spec(dict(spec), max_points=max_points)
    return load_spec(find_experiment(spec), max_points=max_points)


def open_sweep(spec: SweepSpec | Mapping[str, Any] | str | Path, out: str | Path | None = None, *,
               resume: bool = False, force: bool = False, executor: str = "local", jobs: int | None = None,
               scheduler: str | None = None, workers: int | None = None,
               max_points: int | None = MAX_POINTS) -> tuple[SweepSpec, Executor, Path]:
    """Everything checked before a sweep starts: its spec, its executor, and its output directory (default:
    `paths.runs_dir() / <spec name>`), resolved. Raises ValueError (one line) and writes nothing."""
    sweep_spec = load_sweep_spec(spec, max_points=max_points)
    pool = make_executor(executor, jobs=jobs, scheduler=scheduler, workers=workers)
    out_dir = check_out_dir(Path(out) if out is not None else runs_dir() / sweep_spec.name, resume=resume,
                            force=force)
    return sweep_spec, pool, out_dir


def sweep(spec: SweepSpec | Mapping[str, Any] | str | Path, out: str | Path | None = None, *,
          resume: bool | None = None, force: bool = False, reuse_stale: bool = False, executor: str = "local",
          jobs: int | None = None,
          scheduler: str | None = None, workers: int | None = None, progress: bool = True,
          max_points: int | None = MAX_POINTS) -> pd.DataFrame:
    """Run a sweep and return its summary table (one row per point: `point_id`, the configuration, the
    summary metrics), as `python -m workbench.sweep` does.

    `spec` is a mapping (`{"base": {...}, "axes": {...}}`, the YAML as data), a YAML file, or a built-in
    experiment's name. Points go to `out/points/<id>/` (default `out`: `$WORKBENCH_RUNS_DIR/<name>`, else
    `runs/<name>`). `resume` (the default unless `force`) keeps the complete points already in `out` and runs
    the rest, so a cell run again costs nothing; a kept point that another package version or git commit
    made runs again (the old one moved to `out/stale/`) unless `reuse_stale`; `force` replaces them;
    `resume=False` refuses an `out` holding a sweep. `executor` is `local` (a process pool of `jobs` workers)
    or `dask`.
    """
    force = switch_argument("force", force)
    resume = not force if resume is None else switch_argument("resume", resume)
    progress = switch_argument("progress", progress)
    jobs, workers = count_argument("jobs", jobs), count_argument("workers", workers)
    max_points = count_argument("max_points", max_points)
    executor = text_argument("executor", executor)
    scheduler = text_argument("scheduler", scheduler, optional=True)
    if not isinstance(spec, SweepSpec | Mapping | str | os.PathLike):
        raise ConfigError(f"spec must be a mapping, a YAML file's path or an experiment's name, got "
                          f"{type(spec).__name__} {shown(spec)}")
    if out is not None and not isinstance(out, str | os.PathLike):
        raise ConfigError(f"out must be a directory's path, got {type(out).__name__} {shown(out)}")
    try:
        sweep_spec, pool, out_dir = open_sweep(spec, out, resume=resume, force=force, executor=executor, jobs=jobs,
                                               scheduler=scheduler, workers=workers, max_points=max_points)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    table = run_sweep(sweep_spec, out_dir, executor=pool, resume=resume, force=force, reuse_stale=reuse_stale,
                      progress=progress)
    table.attrs["sweep_dir"] = str(out_dir)  # where `workbench.api.point` reads a point's tables
    return table


def _say(line: str | None) -> None:
    if line is not None:
        print(line, file=sys.stderr)


def made_by(folder: Path) -> tuple[Any, Any]:
    """The package version and git commit that a point's config.json records (None where it records none)."""
    description, _ = read_config(folder)
    return description.get("version"), description.get("git_commit")


def _code_label(version: Any, commit: Any) -> str:
    if version is None and commit is None:
        return "code that recorded no version"
    return f"version {version}" + (f" at commit {str(commit)[:12]}" if commit else " outside a git checkout")


def set_aside_stale(out_dir: Path, kept: list[Point], num_points: int) -> str | None:
    """Move the kept points that other code made (another package version or git commit than this one's)
    to OUT/stale/, so that the sweep runs them again; returns the line that says how many and why."""
    now = code_version()
    current = (now["version"], now["git_commit"])
    stale: dict[tuple[Any, Any], int] = {}
    for point in kept:
        folder = out_dir / POINTS_DIR / point.point_id
        maker = made_by(folder)
        if maker == current:
            continue
        aside = out_dir / STALE_DIR / f"{point.point_id}-{uuid.uuid4().hex[:8]}"
        aside.parent.mkdir(exist_ok=True)
        os.rename(folder, aside)
        stale[maker] = stale.get(maker, 0) + 1
    if not stale:
        return None
    makers = "; ".join(f"{count} by {_code_label(*maker)}" for maker, count in stale.items())
    return (f"resume: running {sum(stale.values())} of {num_points} points again: they were made by other code "
            f"({makers}), this is {_code_label(*current)}; the old points are in {out_dir / STALE_DIR}/ "
            f"(--reuse-stale keeps them instead)")


def _keep(out_dir: Path, point: Point) -> bool:
    """Resume: True when the point's directory is complete; a broken one is moved to OUT/broken/."""
    folder = out_dir / POINTS_DIR / point.point_id
    if not folder.exists():
        return False
    problem = point_problem(out_dir / POINTS_DIR, point)
    if problem is None:
        return True
    broken = out_dir / BROKEN_DIR / f"{point.point_id}-{uuid.uuid4().hex[:8]}"
    broken.parent.mkdir(exist_ok=True)
    os.rename(folder, broken)
    print(f"point {point.index} [{point.point_id}]: {problem}; moved to {broken}, running it again", file=sys.stderr)
    return False
