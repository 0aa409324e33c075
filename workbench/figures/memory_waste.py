"""memory_waste: where the KV cache goes, per strategy — the vLLM paper's Figure 2 as stacked bars.

Each bar is one point of the sweep: the six-way partition of the pool (token KV, reserved, internal and
external fragmentation, prefix cache, free) as step-duration-weighted means over the saturated
steps (a request was waiting, so the memory was the bottleneck), or over all steps when some point
never saturated. Categories that are zero for every point are left out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from workbench.figures import style


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    saturated = all(summary[style.MEM_FRAC_SAT_KEY[c]].notna().all() for c in style.STACK_ORDER)
    keys = style.MEM_FRAC_SAT_KEY if saturated else style.MEM_FRAC_KEY
    fig, ax = style.new_figure(width_in=max(style.COLUMN_WIDTH_IN, 1.6 + 0.55 * len(summary)), height_in=2.8)
    x = np.arange(len(summary))  # [num_points]
    bottom = np.zeros(len(summary))
    for column in style.STACK_ORDER:
        percent = summary[keys[column]].to_numpy(dtype=float) * 100  # [num_points]
        if not np.any(percent > 0):
            continue
        label, color, hatch = style.SLOT_STYLE[column]
        ax.bar(x, percent, bottom=bottom, width=0.62, label=label, color=color, hatch=hatch, edgecolor="black",
               linewidth=0.4)
        bottom += percent
    token = summary[keys["token_slots"]].to_numpy(dtype=float) * 100
    for xi, value in zip(x, token, strict=True):
        ax.text(xi, value / 2, f"{value:.0f}%", ha="center", va="center", fontsize=7, fontweight="bold",
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.8, "linewidth": 0})
    ax.set_xticks(x, [style.tick_label(s, b) for s, b in zip(summary["strategy"], summary["block_size"], strict=True)])
    ax.set_ylim(0, 100)
    ax.set_ylabel("KV cache slots (% of capacity)")
    ax.set_title(f"KV cache usage, {'saturated' if saturated else 'all'} steps")
    ax.grid(axis="x", visible=False)
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig
