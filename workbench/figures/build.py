"""Build a figure: run (or resume) its sweep, plot from the summary, save PNG + PDF + provenance.

Figure values come only from the sweep's files (summary.parquet, and steps.parquet for timelines);
the provenance sidecar ties the picture to the exact configurations and code that produced it.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

import workbench
from workbench.figures import style
from workbench.figures.caption import add_caption, caption_line
from workbench.figures.registry import caption_note, experiment_path, is_timed, plotter
from workbench.paths import IN_CHECKOUT, REPO_ROOT
from workbench.sweep.executors import Executor, LocalExecutor
from workbench.sweep.runner import run_sweep
from workbench.sweep.spec import SweepSpec, load_spec
from workbench.sweep.summary import read_summary

# the committed figures of a checkout; an installed package writes beside the working directory instead
FIGURES_DIR = REPO_ROOT / "figures" if IN_CHECKOUT else Path("figures")
RUNS_DIR = Path("runs")


def draw(name: str, sweep_dir: Path) -> Figure:
    """Figure `name` plotted from the finished sweep in `sweep_dir` (its summary.parquet)."""
    return draw_table(name, read_summary(sweep_dir), Path(sweep_dir))


def draw_table(name: str, summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    """Figure `name` plotted from a sweep's summary table; figures that read the points' steps find them in
    `sweep_dir`. The caption line says what was measured, and what the figure adds (`caption_note`)."""
    with style.figure_style():
        fig = plotter(name)(summary, Path(sweep_dir))
        add_caption(fig, "\n".join(filter(None, [caption_line(summary), caption_note(name, summary)])))
    return fig


def draw_into(name: str, sweep_dir: Path, out_dir: Path) -> list[Path]:
    """Plot figure `name` from the finished sweep in `sweep_dir`; writes out_dir/NAME.{png,pdf}."""
    return style.save(draw(name, sweep_dir), Path(out_dir), name)


def build(name: str, *, figures_dir: Path = FIGURES_DIR, runs_dir: Path = RUNS_DIR, executor: Executor | None = None,
          progress: bool = True, command: str = "", spec: SweepSpec | None = None) -> list[Path]:
    """Run or resume the figure's sweep into runs_dir/fig_NAME, then write figures_dir/NAME.{png,pdf}
    and NAME.provenance.json. `spec` replaces the shipped experiment (smaller sweeps in tests)."""
    spec = spec or load_spec(experiment_path(name))
    sweep_dir = Path(runs_dir) / f"fig_{name}"
    if executor is None:
        # timed points: one at a time, single-threaded, so that another process taking a core cannot
        # stall a parallel region for a scheduler time slice inside the measurement
        executor = LocalExecutor(1, threads_per_task=1) if is_timed(name) else LocalExecutor()
    run_sweep(spec, sweep_dir, executor=executor, resume=True, progress=progress)
    paths = draw_into(name, sweep_dir, figures_dir)
    sidecar = Path(figures_dir) / f"{name}.provenance.json"
    sidecar.write_text(json.dumps(provenance(name, spec, command), indent=2) + "\n")
    return [*paths, sidecar]


def provenance(name: str, spec: SweepSpec, command: str) -> dict[str, Any]:
    return {
        "figure": name,
        "experiment": _relative(Path(spec.source)),
        "config_hash": spec.config_hash(),
        "num_points": len(spec.points()),
        "git_commit": _git("rev-parse", "HEAD"),
        # tracked inputs that differ from the commit; figures/ and notebooks/ are outputs, and a rebuild
        # rewrites the first figures before it draws the next ones
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)figures",
                               ":(exclude)notebooks")),
        "package_version": workbench.__version__,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
    }


def _relative(path: Path) -> str:
    """The experiment's path in the repository (the wheel's copy as `workbench/_experiments/...`); a file
    elsewhere by its name only, since its folder is one machine's."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return path.name


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
