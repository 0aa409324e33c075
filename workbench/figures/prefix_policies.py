"""prefix_policies: prefix caches and eviction policies against the device pool's capacity.

One row per workload. Left: token-level prefix-cache hit rate of every (strategy with a prefix cache,
`--eviction`) pair against the KV pool's capacity, beside the workload's infinite-cache bound (dashed:
what a cache that never evicts would serve, with one prompt token always computed;
`workload.describe`, computed from the workload's segments, not from a run). Points with a host tier
(`host_cache_gib` > 0) are drawn as their own curves, hit rate = device + host hits, with hollow
markers. Right: output-token throughput at the same points.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from workbench.config import RunConfig
from workbench.figures import style
from workbench.workload import build_workload
from workbench.workload.describe import prefix_sharing

POLICY_LINESTYLES = {"lru": "-", "fifo": "--", "lfu": ":", "depth": "-."}
UNDERLAY_WIDTH = 1.8  # points added to the line of each strategy drawn before another
_CONFIG_FIELDS = {f.name for f in dataclasses.fields(RunConfig)}


def infinite_cache_bound(row: pd.Series) -> float:
    """The infinite-cache hit rate of the workload of a summary row, at its block size."""
    cfg = RunConfig(**{k: _plain(row[k]) for k in _CONFIG_FIELDS if k in row.index and not _missing(row[k])})
    return prefix_sharing(build_workload(cfg), int(row["block_size"])).bound_frac


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    del sweep_dir
    rows = summary[summary["strategy"].map(style.has_prefix_cache).astype(bool)]
    workloads = list(dict.fromkeys(rows["workload"]))  # in sweep order
    fig, axes = style.new_figure(len(workloads), 2, width_in=style.PAGE_WIDTH_IN, height_in=0.6 + 2.8 * len(workloads))
    axes = np.asarray(axes).reshape(len(workloads), 2)
    # strategies that give the same hits (radix at page = block and paged-prefix do) would hide each other:
    # the ones drawn first are drawn wider, so each shows as an outline around the next
    underlay_width = {name: UNDERLAY_WIDTH * i for i, name in enumerate(reversed(dict.fromkeys(rows["strategy"])))}
    for (hits, speed), workload in zip(axes, workloads, strict=True):
        _plot_workload(hits, speed, rows[rows["workload"] == workload], underlay_width)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    keep = [i for i, label in enumerate(labels) if not label.startswith("infinite cache")]
    bound = Line2D([], [], color="black", linestyle="--", linewidth=0.8)
    fig.legend([handles[i] for i in keep] + [bound], [labels[i] for i in keep] + ["infinite cache (the bound)"],
               loc="outside upper center", ncols=3, fontsize="x-small")
    return fig


def _plot_workload(hits, speed, rows: pd.DataFrame, underlay_width: dict[str, float]) -> None:
    """One workload's hit-rate and throughput panels; `underlay_width` is added to each strategy's line."""
    host_gib = rows["host_cache_gib"] if "host_cache_gib" in rows else pd.Series(0.0, index=rows.index)
    for (strategy, eviction, gib), part in rows.groupby(["strategy", "eviction", host_gib], sort=False):
        part = part.sort_values("kv_slots")
        x = part["kv_slots"].to_numpy() / 1000
        label = f"{style.strategy_label(strategy)}, {eviction}"
        width = underlay_width[strategy]
        kw = dict(marker=style.strategy_marker(strategy), color=style.strategy_color(strategy),
                  linestyle=POLICY_LINESTYLES.get(eviction, "-"), label=label, linewidth=1.2 + width)
        hit_rate = part["prefix_hit_rate"].to_numpy(dtype=float)
        if gib > 0:  # a host tier: its hits count too
            hit_rate = hit_rate + part["prefix_hit_rate_host"].to_numpy(dtype=float)
            kw.update(linewidth=2.2 + width, markerfacecolor="white", label=f"{label} + {gib:g} GiB host tier")
        hits.plot(x, hit_rate * 100, **kw)
        speed.plot(x, part["throughput_tok_s"].to_numpy(dtype=float), **kw)
    bound = infinite_cache_bound(rows.iloc[0]) * 100
    hits.axhline(bound, color="black", linestyle="--", linewidth=0.8, label=f"infinite cache ({bound:.1f}%)")
    hits.annotate(f"infinite cache {bound:.1f}%", (0.02, bound), xycoords=("axes fraction", "data"),
                  xytext=(0, 2), textcoords="offset points", fontsize="x-small", va="bottom")
    hits.set_ylim(top=bound * 1.15)
    sizes_k = np.unique(rows["kv_slots"].to_numpy() / 1000)  # [num_sizes]
    for ax in (hits, speed):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes_k, [f"{k:,.0f}" for k in sizes_k])
        ax.minorticks_off()
        ax.set_xlabel("KV cache capacity (thousand token slots)")
        ax.set_ylim(bottom=0)
    hits.set_ylabel("Prefix hit rate (% of prompt)")
    hits.set_title(style.workload_label(str(rows["workload"].iloc[0])))
    speed.set_ylabel("Throughput (output tokens/s)")
    speed.set_title("Throughput")


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value
