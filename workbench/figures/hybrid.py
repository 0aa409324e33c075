"""hybrid: what per-layer-group allocation (`--hybrid on`) saves. Top: the KV one request holds in each
layer group against its context length, for gpt-oss-120b and Gemma 3 27B, measured on the allocator
(`hybrid_memory`); `--hybrid off` keeps every layer's tokens. Bottom: batch size and throughput with
`--hybrid on` and off as the KV pool grows, for a hybrid model on a long-context trace (the sweep).
Window layers release the blocks their queries can no longer read, so the same pool holds more
sequences (docs/hybrid.md)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from workbench.figures import style
from workbench.figures.hybrid_memory import memory_per_request

# (summary key, axis label) of each sweep panel
PANELS = (("mean_batch_size", "Mean batch size"), ("throughput_tok_s", "Throughput (tokens/s)"))
MARKERS = {"on": "o", "off": "s"}
MEMORY_MODELS = ("gpt-oss-120b", "gemma-3-27b")  # 1:1 windows of 128 tokens; 5:1 windows of 1024
MEMORY_CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)  # tokens
GROUP_COLORS = ("#E69F00", "#009E73")  # window group, full group (in the presets' order)


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    fig, axes = style.new_figure(nrows=2, ncols=len(PANELS), width_in=2 * style.COLUMN_WIDTH_IN, height_in=4.6)
    for ax, name in zip(axes[0], MEMORY_MODELS, strict=True):
        _memory_panel(ax, name)
    for ax, (key, label) in zip(axes[1], PANELS, strict=True):
        for hybrid, rows in summary.groupby("hybrid", sort=True):
            rows = rows.sort_values("kv_gib")
            ax.plot(rows["kv_gib"].to_numpy(), rows[key].to_numpy(), label=f"--hybrid {hybrid}",
                    marker=MARKERS[hybrid], color=style.strategy_color("paged"),
                    linestyle="-" if hybrid == "on" else "--")
        ax.set_xlabel("KV cache (GiB)")
        ax.set_ylabel(label)
        ax.legend()
    models = summary["model"].unique()
    if len(models) == 1:
        axes[1][0].set_title(f"{models[0]}, {style.workload_label(summary['workload'].iloc[0])}", fontsize=8,
                             loc="left")
    return fig


def _memory_panel(ax, name: str) -> None:
    on = memory_per_request(name, list(MEMORY_CONTEXTS), hybrid=True)
    off = memory_per_request(name, list(MEMORY_CONTEXTS), hybrid=False)
    groups = [c for c in on.columns if c not in ("model", "hybrid", "context", "total")]
    for column, color in zip(groups, GROUP_COLORS, strict=True):
        ax.plot(on["context"].to_numpy(), on[column].to_numpy(), marker="o", ms=3, color=color, label=f"on: {column}")
    ax.plot(on["context"].to_numpy(), on["total"].to_numpy(), marker="s", ms=3, color="black", label="on: total")
    ax.plot(off["context"].to_numpy(), off["total"].to_numpy(), color="black", linestyle="--",
            label="off: every layer full")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("Context length (tokens)")
    ax.set_ylabel("KV per request (GiB, bf16)")
    ax.set_title(name, fontsize=8)
    ax.legend(fontsize=6)
