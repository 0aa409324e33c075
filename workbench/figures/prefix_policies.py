"""prefix_policies: prefix caches and eviction policies against the device pool's capacity.

Left: token-level prefix-cache hit rate of every (strategy with a prefix cache, `--eviction`) pair
against the KV pool's capacity, beside the workload's infinite-cache bound (dashed: what a cache
that never evicts would serve, with one prompt token always computed; `workload.describe`, computed
from the workload's segments, not from a run). Points with a host tier (`host_cache_gib` > 0) are
drawn as their own curves, hit rate = device + host hits, with hollow markers. Right: output-token
throughput at the same points.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from workbench.config import RunConfig
from workbench.figures import style
from workbench.workload import build_workload
from workbench.workload.describe import prefix_sharing

POLICY_LINESTYLES = {"lru": "-", "fifo": "--", "lfu": ":", "depth": "-."}
_CONFIG_FIELDS = {f.name for f in dataclasses.fields(RunConfig)}


def infinite_cache_bound(row: pd.Series) -> float:
    """The infinite-cache hit rate of the workload of a summary row, at its block size."""
    cfg = RunConfig(**{k: _plain(row[k]) for k in _CONFIG_FIELDS if k in row.index and not _missing(row[k])})
    return prefix_sharing(build_workload(cfg), int(row["block_size"])).bound_frac


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    del sweep_dir
    rows = summary[summary["strategy"].map(style.has_prefix_cache).astype(bool)]
    fig, (hits, speed) = style.new_figure(1, 2, width_in=style.PAGE_WIDTH_IN, height_in=2.6)
    host_gib = rows["host_cache_gib"] if "host_cache_gib" in rows else pd.Series(0.0, index=rows.index)
    for (strategy, eviction, gib), part in rows.groupby(["strategy", "eviction", host_gib], sort=False):
        part = part.sort_values("kv_slots")
        x = part["kv_slots"].to_numpy() / 1000
        label = f"{style.strategy_label(strategy)}, {eviction}"
        kw = dict(marker=style.strategy_marker(strategy), color=style.strategy_color(strategy),
                  linestyle=POLICY_LINESTYLES.get(eviction, "-"), label=label)
        hit_rate = part["prefix_hit_rate"].to_numpy(dtype=float)
        if gib > 0:  # a host tier: its hits count too
            hit_rate = hit_rate + part["prefix_hit_rate_host"].to_numpy(dtype=float)
            kw.update(linewidth=2.2, markerfacecolor="white", label=f"{label} + {gib:g} GiB host tier")
        hits.plot(x, hit_rate * 100, **kw)
        speed.plot(x, part["throughput_tok_s"].to_numpy(dtype=float), **kw)
    bound = infinite_cache_bound(rows.iloc[0]) * 100
    hits.axhline(bound, color="black", linestyle="--", linewidth=0.8, label=f"infinite cache ({bound:.1f}%)")
    sizes_k = np.unique(rows["kv_slots"].to_numpy() / 1000)  # [num_sizes]
    for ax in (hits, speed):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes_k, [f"{k:,.0f}" for k in sizes_k])
        ax.minorticks_off()
        ax.set_xlabel("KV cache capacity (thousand token slots)")
        ax.set_ylim(bottom=0)
    hits.set_ylabel("Prefix-cache hit rate (% of prompt tokens)")
    hits.set_title(style.workload_label(str(rows["workload"].iloc[0])))
    speed.set_ylabel("Throughput (output tokens/s)")
    speed.set_title("Throughput")
    # the throughput panel's lower half is empty: the legend goes there, off the hit-rate curves
    speed.legend(*hits.get_legend_handles_labels(), fontsize="x-small", loc="lower right")
    return fig


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value
