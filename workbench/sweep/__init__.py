"""Parameter sweeps (docs/outputs.md): a YAML spec expanded into runs, executed on a process pool or a Dask
cluster, each point written atomically, summarized in one parquet table."""

from __future__ import annotations

from workbench.callable_module import make_callable
from workbench.sweep.executors import DaskExecutor, Executor, LocalExecutor, make_executor
from workbench.sweep.runner import SweepError, run_sweep
from workbench.sweep.spec import Point, SpecError, SweepSpec, config_id, load_spec, parse_spec
from workbench.sweep.summary import read_summary

__all__ = [
    "DaskExecutor", "Executor", "LocalExecutor", "Point", "SpecError", "SweepError", "SweepSpec", "config_id",
    "load_spec", "make_executor", "parse_spec", "read_summary", "run_sweep",
]


make_callable(__name__, "workbench.sweep.runner:sweep")  # `workbench.sweep(spec)` is workbench.sweep.runner.sweep
