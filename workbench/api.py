"""The workbench from Python: one call runs a simulation or a sweep and returns its tables.

    import workbench as wb

    result = wb.run(strategy="paged", rate=8, num_requests=600)   # a Result; its repr is the run table
    result.steps, result.requests, result.summary                  # DataFrames, in memory
    result.save("runs/paged")                                      # the four files of `--out`
    table = wb.sweep("quickstart")                                 # the summary table of a sweep
    wb.point(table, table.point_id[0]).requests                    # one point of it, as a Result
    wb.load("runs/paged")                                          # a saved run or point, as a Result
    wb.strategies(), wb.models(), wb.gpus(), wb.traces(), wb.flags()

`run` takes the flags of `python -m workbench.run` by their config names (`--kv-gib` is `kv_gib`) and
checks them as the command does, before any work: a bad flag raises `ConfigError` with the text the
command prints after `error: `. The command-line tool is built on these functions. `workbench.sweep(...)`
is `workbench.sweep.runner.sweep`, and `workbench.plot` draws figures from results and sweeps.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.arguments import switch_argument
from workbench.config import Resolved, RunConfig
from workbench.errors import ConfigError, UnservableError, WorkloadError, shown
from workbench.outdir import check_target
from workbench.result_dir import read_result
from workbench.results import write_outputs
from workbench.run_table import dropped_rows_note, format_summary, html_summary
from workbench.sweep.spec import config_id
from workbench.sweep.summary import summary_row


def run_title(cfg: RunConfig) -> str:
    """The line above a run's table: strategy, block size, model and workload."""
    return f"{cfg.strategy} (block {cfg.block_size}) · {cfg.model} · {cfg.workload}"


class Result:
    """One finished run, held in memory.

    Attributes:
        config: the run's configuration (`RunConfig`).
        steps: one row per engine step (the columns of steps.parquet, docs/outputs.md).
        requests: one row per request (the columns of requests.parquet).
        summary: one row: `point_id`, the configuration, then the run's summary metrics, laid out as a
            row of a sweep's summary table, so that results and sweeps concatenate and plot alike.
        metrics: the summary metrics as a dict (summary.json). `figures`, its former name, still reads
            it for one release, with a DeprecationWarning.
        description: the resolved configuration and where it ran (config.json).
    """

    def __init__(self, config: RunConfig, steps: pd.DataFrame, requests: pd.DataFrame, metrics: dict[str, Any],
                 description: dict[str, Any]) -> None:
        self.config = config
        self.steps = steps
        self.requests = requests
        self.metrics = metrics
        self.description = description
        self.summary = pd.DataFrame([summary_row(config_id(config), config.to_dict(), metrics)])

    @property
    def figures(self) -> dict[str, Any]:
        """The summary metrics under their former name; `figures` means plots everywhere else."""
        warnings.warn("Result.figures is renamed Result.metrics (the summary numbers); the old name goes in the "
                      "next release", DeprecationWarning, stacklevel=2)
        return self.metrics

    @property
    def title(self) -> str:
        """What ran: strategy, block size, model and workload."""
        return run_title(self.config)

    def __repr__(self) -> str:
        return f"{self.title}\n{format_summary(self.metrics)}"

    def _repr_html_(self) -> str:
        return html_summary(self.title, self.metrics)

    def save(self, path: str | Path, *, force: bool = False) -> Path:
        """Write config.json, steps.parquet, requests.parquet and summary.json into the directory `path`,
        as `python -m workbench.run --out` does: a directory holding results is refused (`ConfigError`)
        unless `force`, and then replaced only once the new one is complete. Returns the resolved path."""
        force = switch_argument("force", force)
        if not isinstance(path, str | os.PathLike):
            raise ConfigError(f"path must be a directory's path, got {type(path).__name__} {shown(path)}")
        try:
            final = check_target(Path(path), replace=force, flag="save:", hint="pass force=True to replace it")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        write_result(self, final, replace=force)
        return final


def load(path: str | Path) -> Result:
    """The run written into the directory `path` (by `Result.save`, `python -m workbench.run --out`, or a
    sweep's `points/<id>/`), read back as a Result. A directory that is not a complete run raises
    ResultError (a ValueError) naming the file at fault and what it should hold."""
    if not isinstance(path, str | os.PathLike):
        raise ConfigError(f"path must be a directory's path, got {type(path).__name__} {shown(path)}")
    description, config, steps, requests, summary = read_result(Path(path))
    return Result(config, steps, requests, summary, description)


def point(table: pd.DataFrame, point_id: str) -> Result:
    """The point `point_id` of the sweep whose summary table `workbench.sweep` returned (or a part of it),
    read back as a Result: its steps and requests tables too."""
    sweep_dir = table.attrs.get("sweep_dir")
    if sweep_dir is None:
        raise ValueError("this table does not say where its sweep is: pass a table workbench.sweep returned, "
                         "or read the point with workbench.load(<sweep dir>/points/<point id>)")
    if point_id not in set(table["point_id"]):
        raise ValueError(f"point {point_id!r} is not in this table")
    return load(Path(sweep_dir) / "points" / point_id)


def write_result(result: Result, path: Path, *, replace: bool) -> None:
    """The run files of `result` into `path` (already checked by `outdir.check_target`), atomically."""
    write_outputs(path, result.description, result.steps, result.requests, result.metrics, replace=replace)


def run_config(**flags: Any) -> RunConfig:
    """The checked configuration of `flags` (names of `RunConfig` fields); raises ConfigError, before any
    work, with the message the command line prints."""
    return _checked(flags)[0]


def _checked(flags: dict[str, Any]) -> tuple[RunConfig, Resolved]:
    """`run_config`'s configuration and its resolved sizes (`check_config`), which a run takes as they are."""
    unknown = [name for name in flags if name not in RunConfig.field_names()]
    if unknown:
        close = difflib.get_close_matches(unknown[0], RunConfig.field_names(), n=1)
        hint = f"did you mean {close[0]}?" if close else "workbench.flags() lists them"
        raise ConfigError(f"unknown flag {unknown[0]!r}; {hint}")
    from workbench.engine.simulation import check_config

    try:
        cfg = RunConfig(**flags)
        return cfg, check_config(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def run(*, progress: bool = False, **flags: Any) -> Result:
    """Run one simulation of `flags` (the flags of `python -m workbench.run`, by config name:
    `strategy="paged", kv_gib=12, rate=8`) and return its tables in memory.

    Raises ConfigError (a ValueError) before any work for a bad flag or a workload the configuration
    cannot serve, with the message the command line prints; `progress` shows a bar of finished requests.
    """
    return _run(*_checked(flags), progress=switch_argument("progress", progress))


def run_checked(cfg: RunConfig, *, progress: bool = False) -> Result:
    """Run a configuration `run_config` has checked. A workload found bad once it is read raises ConfigError."""
    return _run(cfg, None, progress=progress)


def _run(cfg: RunConfig, res: Resolved | None, *, progress: bool) -> Result:
    """`run_checked`, with the config's resolved sizes when the caller has them (None: resolved here)."""
    from workbench.engine.simulation import run_in_memory

    try:
        tables, description = run_in_memory(cfg, progress=progress, res=res)
    except (WorkloadError, UnservableError) as exc:
        raise ConfigError(str(exc)) from None
    if (note := dropped_rows_note(cfg.workload, tables.summary)) is not None:
        print(note, file=sys.stderr)
    return Result(cfg, tables.steps, tables.requests, tables.summary, description)


def flags() -> pd.DataFrame:
    """The flags of `run` (and of `python -m workbench.run`): name, default, allowed values and help."""
    from workbench.config import describe_bounds

    rows = [{"flag": f.name, "default": f.default,
             "allowed": ", ".join(f.metadata.get("choices", ())) or describe_bounds(f),
             "help": f.metadata["help"]} for f in dataclasses.fields(RunConfig)]
    return pd.DataFrame(rows).set_index("flag")


def strategies() -> pd.DataFrame:
    """The registered allocation strategies: family, how the kernel addresses the pool, the flags each
    takes, whether it holds a prefix cache, and what it is (the first paragraph of its docstring)."""
    from workbench.allocators import registry

    rows = []
    for name in registry.names():
        reg = registry.get(name)
        module, cls = reg.factory.split(":")
        found = importlib.import_module(module)
        doc = getattr(found, cls).__doc__ or found.__doc__ or ""
        summary = " ".join(doc.strip().split("\n\n")[0].split()).removeprefix(f"`{name}`: ")  # its first paragraph
        rows.append({"strategy": name, "label": reg.label, "family": reg.family, "kernel_mode": reg.kernel_mode,
                     "block_sized": reg.block_sized, "prefix_cache": reg.prefix_cache,
                     "flags": ", ".join(reg.options), "description": summary})
    return pd.DataFrame(rows).set_index("strategy")


def models() -> pd.DataFrame:
    """The model presets (`model=`): shape, parameters, context, KV bytes per token at fp16, and the layer
    groups: full attention, sliding windows (`window`) and recurrent layers (`state:BYTES` per sequence each)."""
    from workbench.presets import MODELS

    rows = []
    for name, m in MODELS.items():
        row = {f.name: getattr(m, f.name) for f in dataclasses.fields(m) if f.name not in ("name", "layer_groups")}
        row["kv_bytes_per_token_fp16"] = m.kv_bytes_per_token("fp16")
        row["layer_groups"] = " + ".join(f"{g.num_layers} {g.label}" for g in m.layer_groups or m.groups())
        rows.append({"model": name, **row})
    return pd.DataFrame(rows).set_index("model")


def gpus() -> pd.DataFrame:
    """The GPU presets (`gpu=`): memory, HBM bandwidth, dense peak and host link."""
    from workbench.presets import GPUS

    return pd.DataFrame([dataclasses.asdict(g) for g in GPUS.values()]).rename(columns={"name": "gpu"}).set_index("gpu")


def traces() -> pd.DataFrame:
    """The registry traces: the `workload=` value that replays each, its rows, size and licence, and where
    it is on this machine (`cache`, `shared`, or None: `python -m workbench.traces fetch NAME` gets it)."""
    from workbench.traces.registry import TRACES
    from workbench.traces.store import cached_path, shared_path

    rows = [{"trace": e.name, "workload": f"{e.format}:{e.name}" if e.format else None, "rows": e.rows,
             "size_mb": e.size_bytes / 1e6 if e.size_bytes else None, "licence": e.licence,
             "here": "cache" if cached_path(e).is_file() else "shared" if shared_path(e) else None,
             "source": e.source} for e in TRACES.values()]
    return pd.DataFrame(rows).set_index("trace")
