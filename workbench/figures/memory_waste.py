"""memory_waste: where the KV cache goes, per strategy — the vLLM paper's Figure 2 as stacked bars.

Each bar is one point of the sweep: the six-way partition of the pool (token KV, reserved, internal and
external fragmentation, cache, free) as step-duration-weighted means over the saturated steps (a
request was waiting, so the memory was the bottleneck), or over all steps when some point of the
panel never saturated. One panel per model, in the sweep's order. Categories that are zero for every
point are left out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from workbench.figures import style


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    panels = list(summary.groupby("model", sort=False))
    fig, axes = style.new_figure(1, len(panels), width_in=max(style.COLUMN_WIDTH_IN, 1.6 + 0.55 * len(summary)),
                                 height_in=2.8, sharey=True, squeeze=False,
                                 gridspec_kw={"width_ratios": [len(rows) for _, rows in panels]})
    legend: dict[str, object] = {}
    for ax, (model, rows) in zip(axes[0], panels, strict=True):
        saturated = _bars(ax, rows, legend)
        ax.set_title(f"{model}, {'saturated' if saturated else 'all'} steps")
        ax.grid(axis="x", visible=False)
    axes[0, 0].set_ylim(0, 100)
    axes[0, 0].set_ylabel("KV cache slots (% of capacity)")
    labels = [style.SLOT_STYLE[c][0] for c in reversed(style.STACK_ORDER) if style.SLOT_STYLE[c][0] in legend]
    axes[0, -1].legend([legend[label] for label in labels], labels, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def _bars(ax, rows: pd.DataFrame, legend: dict[str, object]) -> bool:
    """Draw one panel's stacked bars; adds each category's handle to `legend`. Returns whether the
    saturated-step means were used."""
    saturated = bool((rows["saturated_step_frac"] > 0).all())  # the _sat figures are 0 without saturated steps
    keys = style.MEM_FRAC_SAT_KEY if saturated else style.MEM_FRAC_KEY
    x = np.arange(len(rows))  # [num_points]
    bottom = np.zeros(len(rows))
    for column in style.STACK_ORDER:
        percent = rows[keys[column]].to_numpy(dtype=float) * 100  # [num_points]
        if not np.any(percent > 0):
            continue
        label, color, hatch = style.SLOT_STYLE[column]
        legend[label] = ax.bar(x, percent, bottom=bottom, width=0.62, label=label, color=color, hatch=hatch,
                               edgecolor="black", linewidth=0.4)
        bottom += percent
    token = rows[keys["token_slots"]].to_numpy(dtype=float) * 100
    for xi, value in zip(x, token, strict=True):
        ax.text(xi, value / 2, f"{value:.0f}%", ha="center", va="center", fontsize=7, fontweight="bold",
                bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.8, "linewidth": 0})
    ax.set_xticks(x, [style.tick_label(r.strategy, r.block_size, style.page_kib_of(r)) for r in rows.itertuples()])
    return saturated
