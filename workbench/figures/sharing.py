"""sharing: memory saved by sharing KV blocks, and prefix-cache hits as the cache grows.

Left: parallel sampling (n samples of one prompt) and beam search (width k) on paged strategies —
block-level savings, the vLLM paper's §6.3 definition (blocks saved by sharing ÷ blocks needed
without sharing), from the points with n > 1 or beam_width > 1. Right: the token-level prefix-cache
hit rate of every strategy with a prefix cache against the pool's capacity, on a trace whose
prompts carry prefix hashes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from workbench.figures import style

WIDTH_COLORS = ("#9ecae1", "#4292c6", "#08519c")


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    fig, (left, right) = style.new_figure(1, 2, width_in=style.PAGE_WIDTH_IN, height_in=2.4)
    _savings(left, summary)
    _prefix_hits(right, summary[summary["strategy"].map(style.has_prefix_cache).astype(bool)])
    return fig


def _savings(ax, summary: pd.DataFrame) -> None:
    groups = [("Parallel sampling", summary[summary["n"] > 1], "n"),
              ("Beam search", summary[summary["beam_width"] > 1], "beam_width")]
    widths = sorted({int(w) for _, rows, key in groups for w in rows[key]})
    bar_w = 0.8 / max(len(widths), 1)
    for j, width in enumerate(widths):
        heights = []
        for _, rows, key in groups:
            match = rows[rows[key] == width]["block_sharing_saving_frac"].to_numpy(dtype=float)
            heights.append(match[0] * 100 if len(match) else np.nan)
        x = np.arange(len(groups)) + (j - (len(widths) - 1) / 2) * bar_w
        ax.bar(x, heights, width=bar_w, label=f"{width}", color=WIDTH_COLORS[j % len(WIDTH_COLORS)],
               edgecolor="black", linewidth=0.4)
    ax.set_xticks(np.arange(len(groups)), [name for name, _, _ in groups])
    ax.set_ylabel("KV blocks saved by sharing (%)")
    ax.set_title("Sharing within a request")
    ax.grid(axis="x", visible=False)
    ax.legend(title="n / beam width", ncols=len(widths))


def _prefix_hits(ax, rows: pd.DataFrame) -> None:
    several = rows["strategy"].nunique() > 1
    for (strategy, workload), part in rows.groupby(["strategy", "workload"], sort=False):
        part = part.sort_values("kv_slots")
        label = style.workload_label(workload)
        ax.plot(part["kv_slots"].to_numpy() / 1000, part["prefix_hit_rate"].to_numpy(dtype=float) * 100,
                marker="o", color=style.strategy_color(strategy),
                label=f"{style.strategy_label(strategy)}: {label}" if several else label)
    ax.set_xscale("log", base=2)
    sizes_k = np.unique(rows["kv_slots"].to_numpy() / 1000)  # [num_sizes]
    ax.set_xticks(sizes_k, [f"{k:,.0f}" for k in sizes_k])
    ax.minorticks_off()
    ax.set_xlabel("KV cache capacity (thousand token slots)")
    ax.set_ylabel("Prefix-cache hit rate (% of prompt tokens)")
    ax.set_title("Prefix caching across requests")
    ax.set_ylim(bottom=0)
    ax.legend()
