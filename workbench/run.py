"""`python -m workbench.run`: one simulation run (docs/outputs.md).

The argument parser is generated from RunConfig's fields (their metadata is the help text, with
units), so a flag exists exactly when a config key does: `--kv-gib` is `kv_gib`. A bad
configuration, or an `--out` that holds results (without `--force`) or cannot be created, is one
line on stderr and exit status 2 before anything runs; nothing is written. So is a workload none of
whose requests the configuration could serve (found once the workload is read, before simulating).
Ctrl-C or SIGTERM exits 130, writing nothing; a failing stdout keeps the written result.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
from pathlib import Path

from workbench.callable_module import make_callable
from workbench.clean_exit import OneLineParser, print_error, run_cli
from workbench.config import RunConfig, describe_bounds
from workbench.errors import ConfigError, TraceError, UnservableError, WorkloadError
from workbench.outdir import OutputExistsError, check_target, install, staging_dir
from workbench.presets import GPUS, MODELS
from workbench.run_table import dropped_rows_note, format_summary

_TYPES = {"int": int, "float": float, "str": str}


def _field_type(annotation: str):
    base = annotation.replace(" | None", "").strip()
    return _TYPES[base]


def _known_names() -> dict[str, str]:
    """The registered names a user picks from, shown in --help beside their flags."""
    from workbench.allocators import registry

    return {"strategy": ", ".join(registry.names()), "model": ", ".join(MODELS), "gpu": ", ".join(GPUS)}


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m workbench.run", description=__doc__.splitlines()[0])
    known = _known_names()
    for f in dataclasses.fields(RunConfig):
        help = f.metadata["help"]
        if f.name in known:
            help += f"; one of: {known[f.name]}"
        if f.default is not None and "default" not in help:
            help += " (default: %(default)s)"
        if describe_bounds(f):
            help += f" [{describe_bounds(f)}]"
        if f.type == "bool":  # a switch: present means on
            kwargs = {"action": "store_true", "help": f.metadata["help"]}
        else:
            kwargs = {"type": _field_type(str(f.type)), "default": f.default, "help": help}
        if f.metadata.get("choices"):
            kwargs["choices"] = f.metadata["choices"]
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, **kwargs)
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="write config.json, steps.parquet, requests.parquet and summary.json here "
                             "(a new directory, renamed into place when complete)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing --out; the old one is removed only once the new one is in place")
    parser.add_argument("--progress", action="store_true", help="show a progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command: the same checks as `workbench.run(**flags)`, but the tables stream to `--out` while the
    run goes (engine.simulation.run), so a long trace runs in bounded memory."""
    args = build_parser().parse_args(argv)
    values = {name: getattr(args, name) for name in RunConfig.field_names()}
    from workbench.api import run_config, run_title
    from workbench.engine.simulation import run
    try:
        cfg = run_config(**values)
        if args.out is not None:
            args.out = check_target(args.out, replace=args.force)  # before simulating, not after
    except ValueError as exc:
        print_error(exc)
        return 2
    staged = None if args.out is None else staging_dir(args.out)  # renamed to --out once complete
    keep_staged = False
    try:
        summary = run(cfg, staged, progress=args.progress)
        if staged is not None:
            install(staged, args.out, replace=args.force)
    except OutputExistsError as exc:  # --out appeared while running: the message names where the result is
        keep_staged = True
        print_error(exc)
        return 2
    except (ConfigError, WorkloadError, TraceError, UnservableError) as exc:  # found once the workload is read
        print_error(exc)
        return 2
    except OSError as exc:  # a full disk or a vanished parent: the staged directory goes, nothing else changed
        print_error(f"cannot write {args.out}: {exc.strerror or exc}; nothing was written")
        return 1
    except KeyboardInterrupt:
        print("interrupted; nothing was written", file=sys.stderr)
        return 130
    finally:
        if staged is not None and not keep_staged:
            shutil.rmtree(staged, ignore_errors=True)
    if (note := dropped_rows_note(cfg.workload, summary)) is not None:
        print(note, file=sys.stderr)
    print(run_title(cfg))
    print(format_summary(summary))
    if args.out is not None:
        print(f"wrote {args.out}/")
    return 0


make_callable(__name__, "workbench.api:run")  # `workbench.run(**flags)` is workbench.api.run

if __name__ == "__main__":
    sys.exit(run_cli(main))
