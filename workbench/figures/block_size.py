"""block_size: the three-way trade-off of the paged block size, on each workload of the sweep.

Small blocks waste little at the end of each sequence (internal fragmentation) but need large block
tables and make the kernel chase more pointers; large blocks do the opposite. Four panels against
the block size: internal fragmentation (% of the pool), mean block-table bytes, the measured attention
kernel time per KV token read (run level, decode and prefill together: `kernel_cost`), and
generated-token throughput (roofline clock).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from workbench.figures import style
from workbench.figures.kernel_cost import ns_per_context_token

WORKLOAD_MARKERS = ("o", "s", "^", "D")


def panels(rows: pd.DataFrame) -> dict[str, object]:
    """The y values of each panel for `rows` (one workload, sorted by block size)."""
    return {
        "Internal fragmentation (% of KV slots)": rows["mem_internal_frag_frac"].to_numpy(dtype=float) * 100,
        "Block-table size (KiB, mean)": rows["block_table_bytes_mean"].to_numpy(dtype=float) / 1024,
        "Kernel time per KV token read (ns)": ns_per_context_token(rows),
        "Throughput (generated tokens/s)": rows["throughput_tok_s"].to_numpy(dtype=float),
    }


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    fig, axes = style.new_figure(2, 2, width_in=style.PAGE_WIDTH_IN, height_in=4.2, sharex=True)
    for i, (workload, rows) in enumerate(summary.groupby("workload", sort=False)):
        rows = rows.sort_values("block_size")
        for ax, (ylabel, values) in zip(axes.flat, panels(rows).items(), strict=True):
            ax.plot(rows["block_size"].to_numpy(), values, marker=WORKLOAD_MARKERS[i % len(WORKLOAD_MARKERS)],
                    label=style.workload_label(workload))
            ax.set_ylabel(ylabel)
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
    for ax in axes[-1]:
        ax.set_xlabel("Block size (tokens)")
    axes[0, 0].legend()
    return fig
