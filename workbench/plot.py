"""Figures one call away: each takes a `Result`, a list of them, or a summary table (a sweep's, or
`pd.concat` of results' `summary`) and returns the matplotlib figure, drawn as the figures under
figures/ are (their style and caption line).

    wb.plot.memory(wb.sweep("quickstart"))      # where the KV cache goes, per strategy
    wb.plot.timeline(result)                     # the pool's partition over simulated time
    wb.plot.latency_vs_rate(table)               # normalized latency against the request rate
    wb.plot.figure("block_size", table)          # any figure of figures/ from a sweep of its kind
    wb.plot.draw_once(ax, series)                # your own lines, coinciding ones drawn once
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from workbench.api import Result
from workbench.figures import fragmentation_timeline, memory_waste, style, throughput_vs_rate
from workbench.figures.build import draw_table
from workbench.figures.caption import add_caption, caption_line
from workbench.figures.coincide import coincidence_notes, coinciding

Data = Result | Sequence[Result] | pd.DataFrame


def summary_of(data: Data) -> pd.DataFrame:
    """The summary table of `data`: a Result's row, the rows of several, or the table itself."""
    if isinstance(data, pd.DataFrame):
        return data
    if isinstance(data, Result):
        return data.summary
    if isinstance(data, Sequence) and data and all(isinstance(r, Result) for r in data):
        return pd.concat([r.summary for r in data], ignore_index=True)
    raise TypeError(f"expected a Result, a list of Results or a summary DataFrame, got {type(data).__name__}")


def _drawn(summary: pd.DataFrame, draw: Callable[[pd.DataFrame], Figure]) -> Figure:
    if summary.empty:
        raise ValueError("nothing to plot: the summary table has no rows")
    with style.figure_style():
        fig = draw(summary)
        add_caption(fig, caption_line(summary))
    return fig


def memory(data: Data) -> Figure:
    """Stacked bars of the pool's six-way partition (token KV, reserved, internal and external
    fragmentation, prefix cache, free), one bar per run, over the saturated steps when every run had some."""
    return _drawn(summary_of(data), lambda summary: memory_waste.plot(summary, Path()))


def latency_vs_rate(data: Data) -> Figure:
    """Normalized latency (s per output token) against the request rate, one line per strategy and block size."""
    summary = summary_of(data)
    if "rate" not in summary or summary["rate"].isna().any():
        raise ValueError("latency_vs_rate needs runs with a request rate (rate=...) in every row")
    return _drawn(summary, lambda rows: throughput_vs_rate.plot(rows, Path()))


def timeline(data: Data, sweep_dir: str | Path | None = None) -> Figure:
    """The pool's partition over simulated time, one panel per run: from each Result's steps, or, for a
    sweep's summary table, from the steps.parquet of its points in `sweep_dir` (default: where the sweep
    that returned the table ran)."""
    if isinstance(data, pd.DataFrame):
        sweep_dir = sweep_dir or data.attrs.get("sweep_dir")  # a table workbench.sweep returned knows it
        if sweep_dir is None:
            raise ValueError("timeline of a summary table needs the sweep's directory (sweep_dir=) for the steps")
        return _drawn(data, lambda rows: fragmentation_timeline.plot(rows, Path(sweep_dir)))
    results = [data] if isinstance(data, Result) else list(data)
    summary = summary_of(results)
    steps = {r.summary["point_id"].iloc[0]: r.steps for r in results}
    return _drawn(summary, lambda rows: fragmentation_timeline.plot_steps(rows, steps.__getitem__))


def figure(name: str, table: pd.DataFrame, sweep_dir: str | Path | None = None) -> Figure:
    """Figure `name` of `python -m workbench.figures` (`workbench.figures.registry.FIGURE_NAMES`) drawn from a
    sweep's summary table, as the figures under figures/ are from theirs; figures that read the points'
    steps find them in `sweep_dir` (default: where the sweep that returned the table ran)."""
    sweep_dir = sweep_dir or table.attrs.get("sweep_dir")
    return draw_table(name, table, Path(sweep_dir) if sweep_dir is not None else Path())


def draw_once(ax, series: Sequence[tuple[str, Any, Any, dict[str, Any]]]) -> list[str]:
    """Plot each `(label, x, y, line style)` of `series` on `ax`, drawing series that coincide point for point
    once: in the first one's style, under their labels joined by ' = '. Returns a sentence per merged group,
    for the figure's caption (`workbench.figures.caption.add_caption`); none when every series differs."""
    groups = coinciding(series)
    for labels, x, y, line_style in groups:
        ax.plot(x, y, **{**line_style, "label": " = ".join(labels)})
    return coincidence_notes(groups)


