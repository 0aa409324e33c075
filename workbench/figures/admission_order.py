"""admission_order: what the order a replica admits its waiting requests in (`--schedule`, SGLang's
`--schedule-policy`) does to prefix-cache hits, time to first token and throughput, under a queue.

One row per workload. Bars: one group per strategy, one bar per order (fcfs, lpm, dfs-weight, lof, random;
dfs-weight only for `radix`, whose tree it walks). The orders only differ where requests wait, so both
workloads are run past the replica's capacity. lpm leaves a queue of more than 128 waiting requests in
arrival order (SGLang's bound on its per-step lookups), so under a long queue it is fcfs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from workbench.config import SCHEDULE_NAMES
from workbench.figures import style

ORDER_COLORS = dict(zip(SCHEDULE_NAMES, ("#bdbdbd", "#6baed6", "#08519c", "#fd8d3c", "#969696"), strict=True))
PANELS = (("prefix_hit_rate", 100.0, "Prefix hit rate (%)"), ("ttft_p50_s", 1.0, "TTFT p50 (s)"),
          ("throughput_tok_s", 1e-3, "Throughput (k tok/s)"))


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    workloads = list(dict.fromkeys(summary["workload"]))
    fig, axes = style.new_figure(len(workloads), len(PANELS), width_in=style.PAGE_WIDTH_IN,
                                 height_in=2.0 * len(workloads))
    axes = np.asarray(axes).reshape(len(workloads), len(PANELS))
    for row, workload in zip(axes, workloads, strict=True):
        points = summary[summary["workload"] == workload]
        for ax, (key, scale, ylabel) in zip(row, PANELS, strict=True):
            _bars(ax, points, key, scale)
            ax.set_ylabel(ylabel)
        row[0].set_title(style.workload_label(workload), loc="left", fontsize=7)
    axes[0, -1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def _bars(ax, points: pd.DataFrame, key: str, scale: float) -> None:
    strategies = list(dict.fromkeys(points["strategy"]))
    width = 0.8 / len(SCHEDULE_NAMES)
    for j, order in enumerate(SCHEDULE_NAMES):
        x, heights = [], []
        for i, strategy in enumerate(strategies):
            rows = points[(points["strategy"] == strategy) & (points["schedule"] == order)]
            if len(rows):
                x.append(i + (j - (len(SCHEDULE_NAMES) - 1) / 2) * width)
                heights.append(float(rows[key].iloc[0]) * scale)
        ax.bar(x, heights, width=width, color=ORDER_COLORS[order], edgecolor="black", linewidth=0.4, label=order)
    ax.set_xticks(range(len(strategies)), strategies)  # the registry's names: the labels are too wide for a third
    ax.grid(axis="x", visible=False)


def caption_note(summary: pd.DataFrame) -> str:
    """radix's hit rate and throughput under dfs-weight against fcfs, per workload."""
    parts = []
    for workload, points in summary[summary["strategy"] == "radix"].groupby("workload", sort=False):
        by = points.set_index("schedule")
        if {"fcfs", "dfs-weight"} <= set(by.index):
            parts.append(f"{style.workload_label(workload)}: hits {by.loc['fcfs', 'prefix_hit_rate']:.0%} -> "
                         f"{by.loc['dfs-weight', 'prefix_hit_rate']:.0%}, throughput "
                         f"{by.loc['dfs-weight', 'throughput_tok_s'] / by.loc['fcfs', 'throughput_tok_s']:.2f}x")
    return "radix, fcfs -> dfs-weight: " + "; ".join(parts) if parts else ""
