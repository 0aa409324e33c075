"""The figures by name: each is the built-in experiment `fig_<name>` (experiments/fig_<name>.yaml)
plus `workbench.figures.<name>.plot`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from workbench.experiments import builtin_dir

FIGURE_NAMES = ("memory_waste", "block_size", "throughput_vs_rate", "sharing", "fragmentation_timeline",
                "kernel_overhead", "chunked_prefill", "prefix_policies", "hybrid", "fleet", "kv_layouts",
                "spec_decode", "admission_order", "recurrent_state")

# plot(summary, sweep_dir) -> Figure: summary is the sweep's summary.parquet; sweep_dir holds points/<id>/
PlotFn = Callable[[pd.DataFrame, Path], Figure]


def check_name(name: str) -> None:
    if name not in FIGURE_NAMES:
        raise ValueError(f"unknown figure {name!r}; expected one of {', '.join(FIGURE_NAMES)}")


def experiment_path(name: str) -> Path:
    check_name(name)
    return builtin_dir() / f"fig_{name}.yaml"


def plotter(name: str) -> PlotFn:
    check_name(name)
    return importlib.import_module(f"workbench.figures.{name}").plot


def is_timed(name: str) -> bool:
    """Figures of measured wall times run their points one at a time and single-threaded."""
    check_name(name)
    return bool(getattr(importlib.import_module(f"workbench.figures.{name}"), "TIMED", False))


def caption_note(name: str, summary: pd.DataFrame) -> str:
    """What a figure adds to its caption line (its module's `caption_note`), '' when nothing."""
    check_name(name)
    note = getattr(importlib.import_module(f"workbench.figures.{name}"), "caption_note", None)
    return note(summary) if note else ""
