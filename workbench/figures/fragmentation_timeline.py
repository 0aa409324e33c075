"""fragmentation_timeline: the six-way partition of the pool over simulated time, one panel per point.

Reads each point's steps.parquet (the per-step slot columns) and stacks them as percentages of the
pool's capacity, in the same order and colors as memory_waste.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from workbench.figures import style
from workbench.sweep.layout import POINTS_DIR


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    points = Path(sweep_dir) / POINTS_DIR
    return plot_steps(summary, lambda point_id: pd.read_parquet(points / point_id / "steps.parquet"))


def plot_steps(summary: pd.DataFrame, steps_of: Callable[[str], pd.DataFrame]) -> Figure:
    """One panel per row of `summary`, from the step table `steps_of(point_id)` of each."""
    ncols = 2 if len(summary) > 1 else 1
    nrows = math.ceil(len(summary) / ncols)
    fig, axes = style.new_figure(nrows, ncols, width_in=style.PAGE_WIDTH_IN, height_in=1.9 * nrows + 0.5,
                                 sharex=True, sharey=True, squeeze=False)
    present = [c for c in style.STACK_ORDER if np.any(summary[style.MEM_FRAC_KEY[c]].to_numpy(dtype=float) > 0)]
    for ax, row in zip(axes.flat, summary.itertuples(index=False), strict=False):
        steps = steps_of(row.point_id)
        t_s = steps["t_s"].to_numpy()  # [num_steps]
        percent = [steps[c].to_numpy(dtype=float) / row.kv_slots * 100 for c in present]  # [num_layers][num_steps]
        ax.stackplot(t_s, *percent, step="post", labels=[style.SLOT_STYLE[c][0] for c in present],
                     colors=[style.SLOT_STYLE[c][1] for c in present], linewidth=0)
        ax.set_title(style.point_label(row.strategy, row.block_size))
        ax.set_ylim(0, 100)
        ax.grid(visible=False)
    axes.flat[0].set_xlim(0, None)
    for ax in axes[:, 0]:
        ax.set_ylabel("KV slots (% of capacity)")
    for ax in axes[-1, :]:
        ax.set_xlabel("Simulated time (s)")
    for ax in list(axes.flat)[len(summary):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="outside right upper")
    return fig

