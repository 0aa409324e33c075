"""`python -m workbench.sweep [EXPERIMENT.yaml]`: run a sweep, print a comparison table, draw its figure.

EXPERIMENT is a YAML file or the name of a built-in experiment (`quickstart`, `fig_<figure>`);
with no argument it runs `quickstart`. When the spec names a `figure`, it is drawn into the output
directory (figures/ holds only what `python -m workbench.figures` builds) through the `FigureHooks`
the entry point passes in: sweeps sit below figures and never import them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from workbench.clean_exit import OneLineParser, print_error
from workbench.experiments import builtin_names
from workbench.sweep.executors import EXECUTOR_NAMES, MAX_WORKERS, ExecutorError
from workbench.sweep.hooks import FigureHooks
from workbench.sweep.lock import SweepLocked
from workbench.sweep.runner import SweepError, open_sweep, run_sweep
from workbench.sweep.spec import MAX_POINTS, SweepSpec

DEFAULT_EXPERIMENT = "quickstart"

# the figures a reader compares strategies by, in table order
TABLE_KEYS = (
    "mem_token_frac", "mem_reserved_frac", "mem_internal_frag_frac", "mem_external_frag_frac",
    "mean_batch_size", "throughput_req_s", "normalized_latency_s_per_tok", "num_preemptions", "prefix_hit_rate",
    "verify_max_rel_err",
)


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m workbench.sweep", description=__doc__.splitlines()[0])
    parser.add_argument("experiment", nargs="?", default=DEFAULT_EXPERIMENT,
                        help=f"sweep YAML file, or a built-in experiment: {', '.join(builtin_names())} "
                             f"(default: {DEFAULT_EXPERIMENT})")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: runs/<experiment name>; $WORKBENCH_RUNS_DIR for runs/)")
    parser.add_argument("--executor", choices=EXECUTOR_NAMES, default="local",
                        help="local: process pool on this machine; dask: a Dask distributed cluster")
    parser.add_argument("-j", "--jobs", type=int, default=None,
                        help=f"worker processes of the local executor (default: the usable cores) [1, {MAX_WORKERS}]")
    parser.add_argument("--scheduler", default=None,
                        help="dask: address of a running scheduler, e.g. tcp://host:8786 (default: a LocalCluster)")
    parser.add_argument("--workers", type=int, default=None,
                        help=f"dask without --scheduler: LocalCluster worker processes (default: the usable cores) "
                             f"[1, {MAX_WORKERS}]")
    parser.add_argument("--resume", action="store_true", help="keep complete points in OUT and run only the rest "
                        "(a point made by another package version or git commit runs again)")
    parser.add_argument("--reuse-stale", action="store_true",
                        help="with --resume: keep complete points even when other code made them")
    parser.add_argument("--force", action="store_true",
                        help="replace the sweep in OUT; the old points are removed only once the new sweep is done")
    parser.add_argument("--yes", action="store_true", help=f"run a sweep of more than {MAX_POINTS:,} points")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return parser


def comparison_table(spec: SweepSpec, table: pd.DataFrame) -> str:
    """The varied run flags and the main summary metrics, one line per point. Memory fractions are over
    the saturated steps (a request was waiting) when every point had some, as the memory_waste figure
    draws them; otherwise over all steps."""
    varied = [k for k in spec.axes] + [k for group in spec.zips for k in group]
    saturated = "saturated_step_frac" in table.columns and bool((table["saturated_step_frac"] > 0).all())
    keys = [k + "_sat" if saturated and k.startswith("mem_") else k for k in TABLE_KEYS]
    metrics = [k for k in keys if k in table.columns and table[k].notna().any()]
    shown = table[["point_id", *varied, *metrics]]
    return shown.to_string(index=False, float_format=lambda x: f"{x:.4g}")


def main(argv: list[str] | None = None, figures: FigureHooks | None = None) -> int:
    """The CLI; without `figures`, a spec's `figure` is not drawn."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.executor == "local" and (args.scheduler or args.workers):
        parser.error("--scheduler and --workers belong to --executor dask")
    if args.executor == "dask" and args.jobs:
        parser.error("-j/--jobs belongs to --executor local; use --workers with dask")
    if args.scheduler and args.workers:
        parser.error("--workers starts a LocalCluster; an existing --scheduler brings its own workers")
    if args.resume and args.force:
        parser.error("--resume keeps the points in OUT and --force replaces them: choose one")
    if args.reuse_stale and not args.resume:
        parser.error("--reuse-stale says which points --resume keeps: pass it with --resume")
    try:  # bad input or an OUT that must not be touched: one line, exit 2, nothing written
        spec, executor, out_dir = open_sweep(args.experiment, args.out, resume=args.resume, force=args.force,
                                             executor=args.executor, jobs=args.jobs, scheduler=args.scheduler,
                                             workers=args.workers, max_points=None if args.yes else MAX_POINTS)
        if spec.figure and figures is not None:
            figures.check(spec.figure)  # before the sweep, not after it
    except ValueError as exc:
        print_error(exc)
        return 2
    try:
        table = run_sweep(spec, out_dir, executor=executor, resume=args.resume, force=args.force,
                          reuse_stale=args.reuse_stale, progress=not args.no_progress)
    except (SweepLocked, ValueError) as exc:
        print_error(exc)
        return 2
    except (SweepError, ExecutorError) as exc:
        print_error(exc)
        return 1
    except OSError as exc:  # a full disk while writing the summary: the finished points stay
        print_error(f"cannot write {out_dir}: {exc.strerror or exc}; finished points are kept in {out_dir}/points")
        return 1
    except KeyboardInterrupt:
        print(f"interrupted; finished points are kept in {out_dir}/points: rerun with --resume to continue",
              file=sys.stderr)
        return 130
    print(f"{spec.name}: {len(table)} points in {out_dir}/ (summary.parquet)")
    print(comparison_table(spec, table))
    if spec.figure and figures is not None:
        paths = figures.draw(spec.figure, out_dir)
        print("figure: " + ", ".join(str(p) for p in paths))
    return 0
