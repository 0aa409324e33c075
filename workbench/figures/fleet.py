"""fleet: the routers of a fleet side by side (docs/fleet.md).

Left: prefix-cache hit rate by router, one bar per fleet size, beside the workload's infinite-cache
bound (dashed: one replica that never evicts; `workload.describe`, from the workload's segments).
Right: time to first token by router, the bar at the median and a tick at the 99th percentile.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

from workbench.config import ROUTER_NAMES
from workbench.figures import style
from workbench.figures.prefix_policies import infinite_cache_bound

BAR_GROUP_WIDTH = 0.8  # of one router's slot on the x axis, shared by its fleet sizes


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    del sweep_dir
    routers = [r for r in ROUTER_NAMES if r in set(summary["router"])]
    sizes = sorted(summary["replicas"].unique())
    fig, (hits, ttft) = style.new_figure(1, 2, width_in=style.PAGE_WIDTH_IN, height_in=2.8)
    width = BAR_GROUP_WIDTH / len(sizes)
    x = np.arange(len(routers))  # [num_routers]
    for k, size in enumerate(sizes):
        rows = summary[summary["replicas"] == size].set_index("router").loc[routers]
        offset = (k - (len(sizes) - 1) / 2) * width
        hits.bar(x + offset, rows["prefix_hit_rate"].to_numpy(dtype=float) * 100, width,
                 label=f"{size} replicas", color=f"C{k}")
        ttft.bar(x + offset, rows["ttft_p50_s"].to_numpy(dtype=float), width, color=f"C{k}")
        ttft.scatter(x + offset, rows["ttft_p99_s"].to_numpy(dtype=float), marker="_", s=80, color="black",
                     label="p99" if k == 0 else None, zorder=3)
    bound = infinite_cache_bound(summary.iloc[0]) * 100
    hits.axhline(bound, color="black", linestyle="--", linewidth=0.8)
    hits.annotate(f"infinite cache {bound:.1f}%", (0.02, bound), xycoords=("axes fraction", "data"),
                  xytext=(0, 2), textcoords="offset points", fontsize="x-small", va="bottom")
    hits.set_ylim(0, bound * 1.2)
    hits.set_ylabel("Prefix-cache hit rate (%)")
    ttft.set_ylabel("Time to first token (s): median, p99")
    ttft.set_yscale("log")
    ttft.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ttft.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ttft.yaxis.set_minor_formatter(NullFormatter())
    for ax in (hits, ttft):
        ax.set_xticks(x, routers, rotation=30, ha="right")
    hits.legend(fontsize="x-small")
    ttft.legend(fontsize="x-small")
    fig.suptitle(style.workload_label(summary["workload"].iloc[0]), fontsize="small")
    return fig
