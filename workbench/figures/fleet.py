"""fleet: the routers of a fleet side by side, and colocated against disaggregated serving (docs/fleet.md).

Left: prefix-cache hit rate by router, one bar per fleet size, beside the workload's infinite-cache
bound (dashed: one replica that never evicts; `workload.describe`, from the workload's segments).
Middle: time to first token by router, the bar at the median and a tick at the 99th percentile.
Right (when the sweep has disaggregated points): at each fleet size, the colocated fleet and each split
into prefill and decode replicas of the same GPU count, behind the same router: time to first token
(bar at the median, tick at p99) and, on the right axis, time per output token at p99 (dots).
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
    split = summary.get("prefill_replicas", pd.Series(0, index=summary.index)).fillna(0) > 0
    disaggregated, summary = summary[split], summary[~split]
    routers = [r for r in ROUTER_NAMES if r in set(summary["router"])]
    sizes = sorted(summary["replicas"].unique())
    panels = 3 if len(disaggregated) else 2
    fig, axes = style.new_figure(1, panels, width_in=style.PAGE_WIDTH_IN, height_in=2.8)
    hits, ttft = axes[:2]
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
    _log_seconds(ttft)
    for ax in (hits, ttft):
        ax.set_xticks(x, routers, rotation=30, ha="right")
    hits.legend(fontsize="x-small")
    ttft.legend(fontsize="x-small")
    if len(disaggregated):
        _plot_layouts(axes[2], summary, disaggregated)
    fig.suptitle(style.workload_label(summary["workload"].iloc[0]), fontsize="small")
    return fig


def _log_seconds(ax) -> None:
    """A log axis of seconds labelled 1, 2, 5 per decade in plain numbers."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def layout_label(row) -> str:
    """"4 colocated" or "2P + 2D": how a fleet's GPUs are used."""
    if row["prefill_replicas"] > 0:
        return f"{int(row['prefill_replicas'])}P + {int(row['decode_replicas'])}D"
    return f"{int(row['replicas'])} colocated"


def _layouts(colocated: pd.DataFrame, disaggregated: pd.DataFrame) -> pd.DataFrame:
    """Per fleet size, the colocated fleet behind the disaggregated points' router, then each split of the
    same GPU count (fewest prefill replicas first)."""
    router = disaggregated["router"].iloc[0]
    rows = []
    for size in sorted(disaggregated["replicas"].unique()):
        rows.append(colocated[(colocated["replicas"] == size) & (colocated["router"] == router)])
        rows.append(disaggregated[disaggregated["replicas"] == size].sort_values("prefill_replicas"))
    return pd.concat(rows, ignore_index=True)


def _plot_layouts(ax, colocated: pd.DataFrame, disaggregated: pd.DataFrame) -> None:
    rows = _layouts(colocated, disaggregated)
    x = np.arange(len(rows))
    colors = ["C7" if p == 0 else "C2" for p in rows["prefill_replicas"].fillna(0)]
    ax.bar(x, rows["ttft_p50_s"].to_numpy(dtype=float), BAR_GROUP_WIDTH, color=colors)
    ax.scatter(x, rows["ttft_p99_s"].to_numpy(dtype=float), marker="_", s=80, color="black", zorder=3,
               label="TTFT p99")
    _log_seconds(ax)
    ax.set_ylabel("Time to first token (s): median, p99")
    ax.set_xticks(x, [layout_label(r) for _, r in rows.iterrows()], rotation=30, ha="right")
    tpot = ax.twinx()
    tpot.plot(x, rows["tpot_p99_s"].to_numpy(dtype=float) * 1e3, "o", color="C3", markersize=4, label="TPOT p99")
    tpot.set_ylabel("Time per output token, p99 (ms)", color="C3")
    tpot.set_ylim(bottom=0)
    ax.set_title(f"same GPUs, router {rows['router'].iloc[0]}", fontsize="x-small")
    handles = ax.get_legend_handles_labels()[0] + tpot.get_legend_handles_labels()[0]
    ax.legend(handles, ["TTFT p99", "TPOT p99"], fontsize="x-small")
