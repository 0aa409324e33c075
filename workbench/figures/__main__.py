"""`python -m workbench.figures [NAME ...]`: run (or reuse) each figure's sweep and write figures/NAME.*"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from workbench.clean_exit import OneLineParser, print_error, run_cli
from workbench.figures.build import FIGURES_DIR, RUNS_DIR, build
from workbench.figures.registry import FIGURE_NAMES
from workbench.paths import REPO_ROOT
from workbench.sweep.executors import EXECUTOR_NAMES, make_executor
from workbench.sweep.runner import SweepError
from workbench.sweep.spec import SpecError

FOLDER_OPTIONS = ("--figures-dir", "--runs-dir")


def recorded_command(argv: list[str]) -> str:
    """The command a provenance sidecar records, run from the repository root: a folder option names its
    folder relative to the repository, and is left out when the folder lies outside it (it says where files
    went on one machine, not what they hold), so that no machine's path is committed."""
    words = ["python", "-m", "workbench.figures"]
    rest = list(argv)
    while rest:
        word = rest.pop(0)
        option, equals, value = word.partition("=")
        if option not in FOLDER_OPTIONS:
            words.append(word)
            continue
        if not equals:
            if not rest:
                words.append(word)
                continue
            value = rest.pop(0)
        try:
            words += [option, str(Path(value).resolve().relative_to(REPO_ROOT))]
        except ValueError:
            continue
    return shlex.join(words)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m workbench.figures", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"figures to build (default: all): "
                        f"{', '.join(FIGURE_NAMES)}")
    parser.add_argument("--figures-dir", type=Path, default=FIGURES_DIR, help="where the figures go")
    parser.add_argument("--runs-dir", type=Path, default=RUNS_DIR, help="where the sweeps go (reused when complete)")
    parser.add_argument("--executor", choices=EXECUTOR_NAMES, default=None,
                        help="default: a local process pool (one worker for timed figures)")
    parser.add_argument("-j", "--jobs", type=int, default=None, help="local executor worker processes")
    parser.add_argument("--scheduler", default=None, help="dask: address of a running scheduler")
    parser.add_argument("--workers", type=int, default=None, help="dask LocalCluster worker processes")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    args = parser.parse_args(argv)
    for name in args.names:
        if name not in FIGURE_NAMES:
            parser.error(f"unknown figure {name!r}; choose from {', '.join(FIGURE_NAMES)}")
    executor = None
    if args.executor or args.jobs:
        executor = make_executor(args.executor or "local", jobs=args.jobs, scheduler=args.scheduler,
                                 workers=args.workers)
    command = recorded_command(argv if argv is not None else sys.argv[1:])
    for name in args.names or FIGURE_NAMES:
        start_s = time.perf_counter()
        try:
            paths = build(name, figures_dir=args.figures_dir, runs_dir=args.runs_dir, executor=executor,
                          progress=not args.no_progress, command=command)
        except (SpecError, SweepError, ValueError, FileNotFoundError) as exc:
            print_error(f"{name}: {exc}")
            return 1
        print(f"{name}: {', '.join(str(p) for p in paths)} ({time.perf_counter() - start_s:.0f} s)")
    return 0


if __name__ == "__main__":  # spawned workers import this module as __mp_main__; they must not rebuild figures
    raise SystemExit(run_cli(main))
