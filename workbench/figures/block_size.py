"""block_size: the three-way trade-off of the paged block size, on each workload of the sweep.

Small blocks waste little at the end of each sequence (internal fragmentation) but need large block
tables and make the kernel chase more pointers; large blocks do the opposite. Four panels against
the block size: internal fragmentation (% of the pool, mean over all steps), mean block-table bytes,
generated-token throughput — from the `clock: roofline` points — and the decode kernel's time per
attended token, from the `clock: measured` points (`kernel_cost.decode_ns_per_token`).

Strategies sized by physical pages instead of blocks (virtual-contiguous: vAttention) are drawn as
hollow markers, each labelled with its page size, at that page size in tokens (`page_kib` over one
token's row in a layer buffer), with no line between them: they ran at those page sizes only. Their
"block tables" are the driver's page tables.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from workbench.allocators.virtual.pages import KVGeometry
from workbench.figures import style
from workbench.figures.kernel_cost import decode_ns_per_token

TIMED = True
WORKLOAD_MARKERS = ("o", "s", "^", "D")
KERNEL_PANEL = "Decode kernel (ns per context token)"


def panels(rows: pd.DataFrame, sweep_dir: Path) -> dict[str, np.ndarray]:
    """The y values of each panel for `rows` (one workload and one clock, sorted by block size)."""
    if (rows["clock"] == "measured").all():
        return {KERNEL_PANEL: np.array([decode_ns_per_token(sweep_dir, p) for p in rows["point_id"]])}
    return {
        "Internal frag. (% of KV slots)": rows["mem_internal_frag_frac"].to_numpy(dtype=float) * 100,
        "Block tables (KiB, mean)": rows["block_table_bytes_mean"].to_numpy(dtype=float) / 1024,
        "Throughput (tokens/s)": rows["throughput_tok_s"].to_numpy(dtype=float),
    }


def granule_tokens(rows: pd.DataFrame) -> np.ndarray:
    """int [num_rows]: tokens per block, or per physical page for page-sized strategies."""
    return np.array([KVGeometry.of(r.model, r.kv_dtype).page_tokens(int(r.page_kib)) if style.page_sized(r.strategy)
                     else r.block_size for r in rows.itertuples()])


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    fig, axes = style.new_figure(2, 2, width_in=style.PAGE_WIDTH_IN, height_in=4.4, sharex=True)
    by_label = dict(zip(["Internal frag. (% of KV slots)", "Block tables (KiB, mean)", KERNEL_PANEL,
                         "Throughput (tokens/s)"], axes.flat, strict=True))
    summary = summary.assign(granule=granule_tokens(summary))
    for i, (workload, rows) in enumerate(summary.groupby("workload", sort=False)):
        for (_, strategy), part in rows.groupby(["clock", "strategy"], sort=False):
            part = part.sort_values("granule")
            paged = style.block_sized(strategy)
            label = style.workload_label(workload) if paged else f"{style.strategy_label(strategy)}, " \
                                                                f"{style.workload_label(workload)}"
            for ylabel, values in panels(part, sweep_dir).items():
                ax = by_label[ylabel]
                # page-sized points are separate runs at page sizes, not a curve over block sizes: no line
                ax.plot(part["granule"].to_numpy(), values, label=label,
                        marker=WORKLOAD_MARKERS[i % len(WORKLOAD_MARKERS)], linestyle="-" if paged else "none",
                        color=None if paged else f"C{i}", markerfacecolor=None if paged else "white")
                if not paged:
                    for x, y, kib in zip(part["granule"], values, part["page_kib"], strict=True):
                        ax.annotate(style.page_label(int(kib)), (x, y), xytext=(3, 3), textcoords="offset points",
                                    fontsize=5.5, color=f"C{i}")
    for ylabel, ax in by_label.items():
        ax.set_ylabel(ylabel)
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
    for ax in axes[-1]:
        ax.set_xlabel("Block or page size (tokens)")
    axes[0, 0].legend()
    return fig
