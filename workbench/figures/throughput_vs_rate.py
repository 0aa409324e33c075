"""throughput_vs_rate: normalized latency (end-to-end latency ÷ output tokens, mean over requests) as
the request rate grows, one line per strategy — the vLLM paper's Figure 12 shape: each strategy
holds a flat latency until its batch stops fitting in the KV cache, then the queue explodes."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from workbench.figures import style


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    fig, ax = style.new_figure(height_in=2.5)
    for (strategy, block_size), rows in summary.groupby(["strategy", "block_size"], sort=False):
        rows = rows.sort_values("rate")
        ax.plot(rows["rate"].to_numpy(), rows["normalized_latency_s_per_tok"].to_numpy(),
                label=style.point_label(strategy, block_size), color=style.strategy_color(strategy),
                marker=style.strategy_marker(strategy))
    ax.set_yscale("log")
    ax.set_xlabel("Request rate (req/s)")
    ax.set_ylabel("Normalized latency (s/token)")
    workloads = summary["workload"].unique()
    if len(workloads) == 1:
        ax.set_title(style.workload_label(workloads[0]))
    ax.legend()
    return fig
