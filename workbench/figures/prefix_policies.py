"""prefix_policies: prefix caches and eviction policies against the device pool's capacity.

One row per workload. Left: token-level prefix-cache hit rate (device + host hits) against the KV
pool's capacity, beside the workload's infinite-cache bound (dashed: what a cache that never evicts
would serve, with one prompt token always computed; `workload.describe`, computed from the
workload's segments, not from a run). Middle: output-token throughput at the same points. The
lines are the reference eviction policy (the sweep's first, lru in the shipped experiment), device
only and with each host tier; colour says which cache, line style and marker which tier. Right: a
table of every eviction policy's device-only hit rate at each capacity, since the policies differ
by less than a line's width.

Caches whose every point gives the same hit rates and throughput (on block-hashed traces, the radix
tree at page = block holds exactly the blocks paged-prefix holds) are drawn once, under one name
joined by `=`, and the caption line says so. Caches whose lines nearly coincide are all drawn, each
earlier one wider than the next so it shows at the edges of the one above, and the caption says by how
much they differ: over the whole figure, or in the one panel where they coincide.
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

TIER_STYLES = (("-", "o", None), ("--", "s", "white"), (":", "^", "white"))  # linestyle, marker, marker face
_CONFIG_FIELDS = {f.name for f in dataclasses.fields(RunConfig)}


def tier_style(i: int) -> tuple[str, str, str | None]:
    """Line style, marker and marker face of the i-th host tier (0: device only)."""
    return TIER_STYLES[i % len(TIER_STYLES)]


def infinite_cache_bound(row: pd.Series) -> float:
    """The infinite-cache hit rate of the workload of a summary row, at its block size."""
    cfg = RunConfig(**{k: _plain(row[k]) for k in _CONFIG_FIELDS if k in row.index and not _missing(row[k])})
    return prefix_sharing(build_workload(cfg), int(row["block_size"])).bound_frac


def cache_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """The points of strategies with a prefix cache, with `hit_rate` (device + host hits) and `host_gib`."""
    rows = summary[summary["strategy"].map(style.has_prefix_cache).astype(bool)]
    host_rate = rows["prefix_hit_rate_host"] if "prefix_hit_rate_host" in rows else 0.0
    host_gib = rows["host_cache_gib"] if "host_cache_gib" in rows else 0.0
    return rows.assign(hit_rate=rows["prefix_hit_rate"] + host_rate, host_gib=host_gib)


_POINT = ["workload", "eviction", "host_gib", "kv_slots"]


def coinciding(rows: pd.DataFrame) -> list[list[str]]:
    """The strategies of `rows` (`cache_rows`) in groups whose points are equal: the same points with the
    same hit rate and throughput. In sweep order; a strategy alone is a group of one."""
    measured = {name: part.set_index(_POINT)[["hit_rate", "throughput_tok_s"]].sort_index()
                for name, part in rows.groupby("strategy", sort=False)}
    groups: list[list[str]] = []
    for name, values in measured.items():
        same = next((g for g in groups if measured[g[0]].equals(values)), None)
        if same is None:
            groups.append([name])
        else:
            same.append(name)
    return groups


def group_label(group: list[str]) -> str:
    return " = ".join(style.strategy_label(name) for name in group)


# lines closer than this are hard to tell apart at the figure's size: the caption says they overlap
OVERLAP_HIT_POINTS = 0.5
OVERLAP_THROUGHPUT_FRAC = 0.01


def line_width(group_index: int, num_groups: int) -> float:
    """The line width of a group's lines: the first drawn widest, so each shows beneath the next."""
    return 1.5 + 2.0 * (num_groups - 1 - group_index)


def overlaps(rows: pd.DataFrame, groups: list[list[str]]) -> list[tuple[str, str, float, float]]:
    """Pairs of groups whose drawn lines (the reference policy, every tier) nearly coincide: (lower group's
    label, upper group's label, largest hit-rate gap in points, largest throughput gap as a fraction)."""
    drawn = rows[rows["eviction"] == reference_policy(rows)]
    lines = {group[0]: drawn[drawn["strategy"] == group[0]].set_index(_POINT)[["hit_rate", "throughput_tok_s"]]
             for group in groups}
    found = []
    for i, low in enumerate(groups):
        for high in groups[i + 1:]:
            a, b = lines[low[0]].align(lines[high[0]], join="inner")
            if a.empty:
                continue
            hit_points = float((a["hit_rate"] - b["hit_rate"]).abs().max() * 100)
            speed_frac = float(((a["throughput_tok_s"] - b["throughput_tok_s"]).abs() / b["throughput_tok_s"]).max())
            if hit_points < OVERLAP_HIT_POINTS and speed_frac < OVERLAP_THROUGHPUT_FRAC:
                found.append((group_label(low), group_label(high), hit_points, speed_frac))
    return found


def panel_overlaps(rows: pd.DataFrame, groups: list[list[str]]) -> list[tuple[str, str, str, str, str]]:
    """Pairs of groups whose lines nearly coincide in one panel only (one workload's hit rate or throughput),
    where `overlaps`, over the whole figure, finds them apart: (lower group's label, upper group's label,
    the panel's measure, its workload, the gap in words)."""
    whole = {(low, high) for low, high, *_ in overlaps(rows, groups)}
    drawn = rows[rows["eviction"] == reference_policy(rows)]
    found = []
    for workload, part in drawn.groupby("workload", sort=False):
        lines = {group[0]: part[part["strategy"] == group[0]].set_index(_POINT)[["hit_rate", "throughput_tok_s"]]
                 for group in groups}
        for i, low in enumerate(groups):
            for high in groups[i + 1:]:
                if (group_label(low), group_label(high)) in whole:
                    continue
                a, b = lines[low[0]].align(lines[high[0]], join="inner")
                if a.empty:
                    continue
                hit_points = float((a["hit_rate"] - b["hit_rate"]).abs().max() * 100)
                speed_frac = float(((a["throughput_tok_s"] - b["throughput_tok_s"]).abs()
                                    / b["throughput_tok_s"]).max())
                label = style.workload_label(str(workload))
                if hit_points < OVERLAP_HIT_POINTS:
                    found.append((group_label(low), group_label(high), "hit rate", label,
                                  f"{_at_most(hit_points)} points"))
                if speed_frac < OVERLAP_THROUGHPUT_FRAC:
                    found.append((group_label(low), group_label(high), "throughput", label,
                                  f"{_at_most(100 * speed_frac)}%"))
    return found


def reference_policy(rows: pd.DataFrame) -> str:
    """The eviction policy the lines draw: the sweep's first."""
    return str(rows["eviction"].iloc[0])


def policy_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Device-only hit rate (% of prompt tokens) of every (workload, cache, eviction policy), one column per
    KV capacity in thousand token slots; coinciding caches (`coinciding`) are one row, named with `=`."""
    rows = cache_rows(summary)
    groups = coinciding(rows)
    rows = rows[(rows["host_gib"] == 0) & rows["strategy"].isin([group[0] for group in groups])]
    names = {group[0]: group_label(group) for group in groups}
    table = rows.assign(cache=rows["strategy"].map(names), capacity_k=rows["kv_slots"] / 1000,
                        hit_rate_pct=rows["prefix_hit_rate"] * 100)
    return table.pivot_table(index=["workload", "cache", "eviction"], columns="capacity_k", values="hit_rate_pct",
                             sort=False)


def caption_note(summary: pd.DataFrame) -> str:
    """What the figure draws once, and where the other policies are (a line each)."""
    rows = cache_rows(summary)
    groups = coinciding(rows)
    parts = [f"{' and '.join(group)} give identical hit rates and throughput at every point: drawn once as "
             f"'{group_label(group)}'" for group in groups if len(group) > 1]
    parts += [f"'{low}' (wide) lies under '{high}': their lines differ by {_at_most(hit)} points of hit rate "
              f"and {_at_most(100 * speed)}% of throughput" for low, high, hit, speed in overlaps(rows, groups)]
    parts += [f"'{low}' (wide) lies under '{high}' in the {measure} of {workload}: they differ by {gap}"
              for low, high, measure, workload, gap in panel_overlaps(rows, groups)]
    parts.append(f"lines: eviction {reference_policy(rows)}; every policy's device-only hit rate in the table")
    return "\n".join(parts)  # a line each: the caption stays as wide as the figure


def _at_most(value: float) -> str:
    return "less than 0.01" if value < 0.01 else f"at most {value:.2f}"


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    del sweep_dir
    rows = cache_rows(summary)
    groups = coinciding(rows)
    tiers = sorted(rows["host_gib"].unique())
    workloads = list(dict.fromkeys(rows["workload"]))  # in sweep order
    fig, axes = style.new_figure(len(workloads), 3, width_in=style.PAGE_WIDTH_IN, height_in=0.8 + 2.6 * len(workloads),
                                 gridspec_kw={"width_ratios": [1.0, 1.0, 1.05]})
    axes = np.asarray(axes).reshape(len(workloads), 3)
    table = policy_table(summary)
    for (hits, speed, cells), workload in zip(axes, workloads, strict=True):
        _plot_workload(hits, speed, rows[rows["workload"] == workload], groups, tiers)
        _table(cells, table.loc[workload], multiple=len(groups) > 1)
    handles = [Line2D([], [], color=style.strategy_color(g[0]), linewidth=line_width(k, len(groups)))
               for k, g in enumerate(groups)]
    labels = [group_label(g) for g in groups]
    for i, gib in enumerate(tiers):
        linestyle, marker, face = tier_style(i)
        handles.append(Line2D([], [], color="#444444", linestyle=linestyle, marker=marker, markerfacecolor=face))
        labels.append(f"{reference_policy(rows)}, device only" if gib == 0 else f"+ {gib:g} GiB host tier")
    handles.append(Line2D([], [], color="black", linestyle="--", linewidth=0.8))
    labels.append("infinite cache (the bound)")
    fig.legend(handles, labels, loc="outside upper center", ncols=3, fontsize="x-small")
    return fig


def _plot_workload(hits, speed, rows: pd.DataFrame, groups: list[list[str]], tiers: list[float]) -> None:
    """One workload's hit-rate and throughput panels: the reference policy of each group at each tier."""
    policy = reference_policy(rows)
    for k, group in enumerate(groups):
        for i, gib in enumerate(tiers):
            linestyle, marker, face = tier_style(i)
            part = rows[(rows["strategy"] == group[0]) & (rows["eviction"] == policy) & (rows["host_gib"] == gib)]
            if part.empty:
                continue
            part = part.sort_values("kv_slots")
            x = part["kv_slots"].to_numpy() / 1000
            tier = "" if gib == 0 else f" + {gib:g} GiB host tier"
            kw = dict(color=style.strategy_color(group[0]), linestyle=linestyle, marker=marker,
                      markerfacecolor=face, linewidth=line_width(k, len(groups)), zorder=2 + k,
                      label=f"{group_label(group)}, {policy}{tier}")
            hits.plot(x, part["hit_rate"].to_numpy(dtype=float) * 100, **kw)
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
        ax.set_xlabel("KV capacity (K token slots)")
        ax.set_ylim(bottom=0)
    hits.set_ylabel("Prefix hit rate (% of prompt)")
    hits.set_title(style.workload_label(str(rows["workload"].iloc[0])))
    speed.set_ylabel("Throughput (output tokens/s)")
    speed.set_title("Throughput")


def _table(ax, table: pd.DataFrame, *, multiple: bool) -> None:
    """The device-only hit rates of one workload as a table: a row per policy (per cache and policy when
    several caches are drawn), a column per capacity."""
    ax.axis("off")
    labels = [f"{cache}: {policy}" if multiple else policy for cache, policy in table.index]
    cells = [[f"{v:.1f}" for v in row] for row in table.to_numpy(dtype=float)]
    drawn = ax.table(cellText=cells, rowLabels=labels, colLabels=[f"{k:,.0f}K" for k in table.columns],
                     colWidths=[0.2] * len(table.columns), loc="center", cellLoc="right")
    drawn.auto_set_font_size(False)
    drawn.set_fontsize(6.5)
    ax.set_title("Hit rate (%), device only, by eviction policy", fontsize="x-small")


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value
