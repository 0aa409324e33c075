"""kernel_overhead: what the paging indirection costs the attention kernel, measured on the real kernel.

Each point runs one fixed-length workload (`fixed:prompt=L,...`) with `clock: measured` and the kernel
on every k-th step; the value is the decode kernel's time per attended token over the decode-only
steps (lower quartile, `kernel_cost.decode_ns_per_token`; prefill attention is quadratic in L and would
swamp it). Left: contiguous vs paged kernels against the context length L. Right: paged ÷ contiguous
time against the block size, at the longest context. Virtual-contiguous (vAttention) runs the contiguous
kernel over extents in a virtual slot space, so its line should lie on the contiguous one; the ratio's
base is the plain contiguous strategy. The points run one at a time and single-threaded
(TIMED): on a shared machine a parallel region waits for its slowest thread, and a thread that loses
its core waits a whole scheduler time slice.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from workbench.figures import style
from workbench.figures.kernel_cost import decode_ns_per_token
from workbench.workload.spec import parse_spec as parse_workload

TIMED = True


def context_tokens(workload: str) -> int:
    """The prompt length L of a `fixed:prompt=L,...` workload (the context the kernel attends to)."""
    spec = parse_workload(workload)
    if spec.kind != "fixed":
        raise ValueError(f"kernel_overhead needs fixed-length workloads (fixed:prompt=L,...), got {workload!r}")
    return spec.get_int("prompt", 128)


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    data = summary.assign(context=[context_tokens(w) for w in summary["workload"]],
                          ns_per_token=[decode_ns_per_token(sweep_dir, p) for p in summary["point_id"]])
    block_sized = data["strategy"].map(style.block_sized).astype(bool)
    contiguous, paged = data[~block_sized], data[block_sized]
    fig, (left, right) = style.new_figure(1, 2, width_in=style.PAGE_WIDTH_IN, height_in=2.5)

    for (strategy, block_size), rows in pd.concat([contiguous, paged]).groupby(["strategy", "block_size"],
                                                                               sort=False):
        page_kib = style.page_kib_of(next(rows.itertuples()))
        if style.block_sized(strategy) and rows["context"].nunique() == 1:
            continue  # a single context length: shown in the right panel only
        rows = rows.sort_values("context")
        left.plot(rows["context"].to_numpy(), rows["ns_per_token"].to_numpy(), marker=style.strategy_marker(strategy),
                  color=None if style.block_sized(strategy) else style.strategy_color(strategy),
                  label=style.point_label(strategy, block_size, page_kib))
    left.set_xscale("log", base=2)
    left.set_xlabel("Context length (tokens)")
    left.set_ylabel("Decode kernel time per context token (ns)")
    left.set_ylim(bottom=0)
    left.legend()

    longest = data["context"].max()
    plain = ~contiguous["strategy"].map(style.page_sized).astype(bool)  # the ratio's base: contiguous extents
    base = contiguous[plain & (contiguous["context"] == longest)]["ns_per_token"].to_numpy()
    at_longest = paged[paged["context"] == longest].sort_values("block_size")
    ratio = at_longest["ns_per_token"].to_numpy() / np.mean(base) if len(base) else np.full(len(at_longest), np.nan)
    color = style.strategy_color(at_longest["strategy"].iloc[0]) if len(at_longest) else None
    right.plot(at_longest["block_size"].to_numpy(), ratio, marker="o", color=color)
    right.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    right.set_ylim(bottom=0)  # from zero: a few percent of timer noise must not read as a trend
    right.set_xscale("log", base=2)
    right.set_xlabel("Block size (tokens)")
    right.set_ylabel("Paged ÷ contiguous kernel time")
    right.set_title(f"Context {longest} tokens")
    return fig
