"""chunked_prefill: what splitting prompts into chunks (Sarathi-Serve, vLLM v1) does to latency and memory.

One bar group per point of the sweep (whole prompts, then chunked prefill at each token budget):
time to first token and time per output token, p50 and p99 over the requests, and the §3 partition
of the pool (step-duration-weighted means over all steps). Unchunked, a step that prefills long
prompts stalls every decoding sequence for its whole length; chunked, each step carries the decodes
plus at most a budget's worth of prompt, so decodes flow evenly while a long prompt takes several
steps to its first token.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from workbench.figures import style

PERCENTILES = (("p50", "#9ecae1"), ("p99", "#08519c"))  # summary key part, bar color


def point_tick(row: pd.Series) -> str:
    """`whole\nprompts` or `chunks\n≤512`: a point's prefill mode and budget."""
    if not row["chunked_prefill"]:
        return "whole\nprompts"
    return f"chunks\n≤{int(row['max_num_batched_tokens'])}"


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    fig, (ttft, tpot, memory) = style.new_figure(1, 3, width_in=style.PAGE_WIDTH_IN, height_in=2.5)
    ticks = [point_tick(row) for _, row in summary.iterrows()]
    _percentile_bars(ttft, summary, "ttft", 1.0, ticks)
    ttft.set_ylabel("Time to first token (s)")
    ttft.set_title("TTFT")
    _percentile_bars(tpot, summary, "tpot", 1e3, ticks)
    tpot.set_ylabel("Time per output token (ms)")
    tpot.set_title("TPOT")
    _memory_stack(memory, summary, ticks)
    workloads = summary["workload"].unique()
    if len(workloads) == 1:
        fig.suptitle(style.workload_label(workloads[0]), fontsize=8)
    return fig


def _percentile_bars(ax, summary: pd.DataFrame, metric: str, scale: float, ticks: list[str]) -> None:
    x = np.arange(len(summary))  # [num_points]
    bar_w = 0.8 / len(PERCENTILES)
    for j, (pct, color) in enumerate(PERCENTILES):
        values = summary[f"{metric}_{pct}_s"].to_numpy(dtype=float) * scale  # [num_points]
        ax.bar(x + (j - (len(PERCENTILES) - 1) / 2) * bar_w, values, width=bar_w, label=pct, color=color,
               edgecolor="black", linewidth=0.4)
    ax.set_xticks(x, ticks)
    ax.margins(y=0.2)  # room for the legend above the tallest bar
    ax.grid(axis="x", visible=False)
    ax.legend(ncols=len(PERCENTILES), loc="upper center")


def _memory_stack(ax, summary: pd.DataFrame, ticks: list[str]) -> None:
    x = np.arange(len(summary))  # [num_points]
    bottom = np.zeros(len(summary))
    for column in style.STACK_ORDER:
        percent = summary[style.MEM_FRAC_KEY[column]].to_numpy(dtype=float) * 100  # [num_points]
        if not np.any(percent > 0):
            continue
        label, color, hatch = style.SLOT_STYLE[column]
        ax.bar(x, percent, bottom=bottom, width=0.62, label=label, color=color, hatch=hatch, edgecolor="black",
               linewidth=0.4)
        bottom += percent
    ax.set_xticks(x, ticks)
    ax.set_ylim(0, 100)
    ax.set_ylabel("KV cache slots (% of capacity)")
    ax.set_title("KV cache usage, all steps")
    ax.grid(axis="x", visible=False)
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], loc="upper left", bbox_to_anchor=(1.0, 1.0))
