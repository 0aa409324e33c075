"""spec_decode: what speculative decoding (docs/speculative.md) buys as the batch grows, and the KV it holds.

Time per output token against the draft tokens per step K, at a light load (small batches: a step is bound
by reading the weights, and K drafts ride along almost free) and at a heavy one (a batch of hundreds: the
verify step's K + 1 query tokens per request make it compute-bound, so each draft costs nearly what it
earns), with the heavy load's throughput and the share of the pool that drafts hold. One color per
acceptance probability alpha, one line style per strategy (paged blocks free a rolled-back draft's block,
a contiguous reservation keeps its slots).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from workbench.figures import style
from workbench.figures.coincide import coincidence_notes, coinciding

ALPHA_COLORS = ("#fdae6b", "#e6550d", "#7f2704")  # light to dark as acceptance rises
LINESTYLES = ("-", "--", ":", "-.")


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    fig, axes = style.new_figure(1, 4, width_in=style.PAGE_WIDTH_IN, height_in=2.3)
    for ax, (title, ylabel, groups) in zip(axes, _panels(summary), strict=True):
        for labels, x, y, line_style in groups:
            ax.plot(x, y, **{**line_style, "label": " = ".join(labels)})
        ax.set_xlabel("Draft tokens per step K")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.set_xticks(sorted(summary["spec_tokens"].unique()))
    axes[1].legend(fontsize=5, loc="upper left")
    workloads = summary["workload"].unique()
    if len(workloads) == 1:
        fig.suptitle(style.workload_label(workloads[0]), fontsize=8)
    return fig


def _panels(summary: pd.DataFrame):
    """Per panel: its title, y label and its series grouped where they coincide point for point."""
    light, heavy = summary["rate"].min(), summary["rate"].max()
    panels = (
        (light, lambda rows: rows["tpot_p50_s"] * 1e3, "TPOT p50 (ms)"),
        (heavy, lambda rows: rows["tpot_p50_s"] * 1e3, "TPOT p50 (ms)"),
        (heavy, lambda rows: rows["throughput_tok_s"] / 1e3, "Throughput (k tok/s)"),
        (heavy, _draft_percent, "Draft slots (% of pool)"),
    )
    alphas = sorted(summary["spec_accept"].unique())
    strategies = list(dict.fromkeys(summary["strategy"]))
    out = []
    for rate, value, ylabel in panels:
        series = []
        for s_i, strategy in enumerate(strategies):
            for a_i, alpha in enumerate(alphas):
                rows = _line(summary, strategy, rate, alpha)
                series.append((f"{style.strategy_label(strategy)}, α={alpha:g}", rows["spec_tokens"].to_numpy(),
                               np.asarray(value(rows), dtype=float),
                               {"marker": "o", "markersize": 3, "color": ALPHA_COLORS[a_i % len(ALPHA_COLORS)],
                                "linestyle": LINESTYLES[s_i % len(LINESTYLES)]}))
        out.append((f"{rate:g} req/s", ylabel, coinciding(series)))
    return out


def _line(summary: pd.DataFrame, strategy: str, rate: float, alpha: float) -> pd.DataFrame:
    """One line's points by K; K = 0 (no drafts, alpha unused) from whichever alpha ran it."""
    rows = summary[(summary["strategy"] == strategy) & (summary["rate"] == rate)]
    rows = rows[(rows["spec_accept"] == alpha) | (rows["spec_tokens"] == 0)]
    return rows.drop_duplicates("spec_tokens").sort_values("spec_tokens")


def _draft_percent(rows: pd.DataFrame) -> pd.Series:
    frac = rows["mem_draft_frac"] if "mem_draft_frac" in rows else pd.Series(0.0, index=rows.index)
    return frac.fillna(0.0) * 100


def caption_note(summary: pd.DataFrame) -> str:
    """TPOT p50 of paged without drafts and with the sweep's largest acceptance at K = 3, at each load."""
    alpha = summary["spec_accept"].max()
    parts = []
    for rate in sorted(summary["rate"].unique()):
        line = _line(summary, "paged", rate, alpha).set_index("spec_tokens")
        if 0 in line.index and 3 in line.index:
            parts.append(f"{rate:g} req/s: {line.loc[0, 'tpot_p50_s'] * 1e3:.1f} -> "
                         f"{line.loc[3, 'tpot_p50_s'] * 1e3:.1f} ms")
    notes = [f"{title}: {note}" for title, _, groups in _panels(summary) for note in coincidence_notes(groups)]
    head = f"paged TPOT p50, K = 0 -> 3 at α = {alpha:g}: " + "; ".join(parts) if parts else ""
    return "\n".join(filter(None, [head, *dict.fromkeys(notes)]))
