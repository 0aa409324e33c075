"""hybrid: batch size and throughput with per-layer-group allocation on (`--hybrid on`) and off, as the
KV pool grows, for a hybrid model on a long-context trace. Window layers release the blocks their
queries can no longer read, so the same pool holds more sequences (docs/hybrid.md)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from workbench.figures import style

# (summary key, axis label) of each panel
PANELS = (("mean_batch_size", "Mean batch size"), ("throughput_tok_s", "Throughput (tokens/s)"))
MARKERS = {"on": "o", "off": "s"}


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    fig, axes = style.new_figure(ncols=len(PANELS), width_in=2 * style.COLUMN_WIDTH_IN, height_in=2.3)
    for ax, (key, label) in zip(axes, PANELS, strict=True):
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
        fig.suptitle(f"{models[0]}, {style.workload_label(summary['workload'].iloc[0])}", fontsize=8)
    return fig
