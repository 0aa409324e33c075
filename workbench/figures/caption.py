"""The caption line every figure carries: what was measured — model, KV capacity, GPU preset and clock,
kernel backend — read from the sweep summary, so a figure cut out of its context still says it."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
from matplotlib.figure import Figure

CPU_BACKENDS = ("numba", "cuda-cpu", "reference")


def _values(summary: pd.DataFrame, column: str, fmt: Callable[[object], str] = str) -> str:
    """The distinct values of a column in order of appearance, joined with '/'."""
    if column not in summary.columns:
        return "?"
    return "/".join(fmt(v) for v in dict.fromkeys(summary[column].dropna())) or "?"


def caption_line(summary: pd.DataFrame) -> str:
    kv = f"{_values(summary, 'kv_slots', lambda v: f'{int(v):,}')} KV slots"
    if "kv_gib" in summary.columns and summary["kv_gib"].notna().all() and summary["kv_gib"].nunique() == 1:
        kv += f" ({summary['kv_gib'].iloc[0]:g} GiB)"
    parts = [_values(summary, "model"), kv, f"GPU preset {_values(summary, 'gpu')}",
             f"{_values(summary, 'clock')} clock", f"kernel {_values(summary, 'kernel_backend')}"]
    measured = summary.get("clock", pd.Series(dtype=object)) == "measured"
    if measured.any() and summary.loc[measured, "kernel_backend"].isin(CPU_BACKENDS).all():
        parts.append("measured kernel times are CPU wall time")
    return " · ".join(parts)


def add_caption(fig: Figure, text: str) -> None:
    """One small line under the plot (kept in the saved file by the tight bounding box)."""
    fig.text(0.0, 0.0, text, ha="left", va="top", fontsize=6, color="#444444")
