"""An interactive explorer for notebooks: pick a strategy, a block size and a request rate, and see the
memory timeline of one run and the six shares of the pool (docs/memory.md).

`explore(...)` runs one simulation (no kernel; the accounting does not need one) and returns the figure;
`explorer(...)` wraps it in ipywidgets controls (the `notebooks` extra) and redraws on every change.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from workbench.allocators import registry
from workbench.config import RunConfig
from workbench.engine.simulation import check_config, simulate
from workbench.figures import style
from workbench.figures.caption import add_caption
from workbench.workload import build_workload

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def explore(strategy: str = "paged", block_size: int = 16, rate: float = 8.0, *, model: str = "opt-13b",
            kv_gib: float | None = 12.0, kv_slots: int | None = None, workload: str = "sharegpt-like",
            num_requests: int = 300, seed: int = 0) -> Figure:
    """Left: the six parts of the pool at every step of one run (% of capacity). Right: their
    duration-weighted shares over all steps and over the saturated ones."""
    cfg = RunConfig(strategy=strategy, block_size=block_size, rate=rate, model=model, kv_gib=kv_gib,
                    kv_slots=kv_slots, workload=workload, num_requests=num_requests, seed=seed, kernel="none")
    res = check_config(cfg)
    instance = registry.create_from_config(cfg, res)
    result = simulate(cfg, build_workload(cfg), instance)
    steps, summary = result.steps, result.summary
    with style.figure_style():
        fig, (timeline, shares) = style.new_figure(1, 2, width_in=style.PAGE_WIDTH_IN, height_in=2.6,
                                                   width_ratios=[2.2, 1])
        percent = [steps[c].to_numpy(dtype=float) / summary["kv_slots"] * 100 for c in style.STACK_ORDER]
        timeline.stackplot(steps["t_s"].to_numpy(), *percent, step="post", linewidth=0,
                           labels=[style.SLOT_STYLE[c][0] for c in style.STACK_ORDER],
                           colors=[style.SLOT_STYLE[c][1] for c in style.STACK_ORDER])
        timeline.set(xlim=(0, None), ylim=(0, 100), xlabel="Simulated time (s)", ylabel="KV slots (% of capacity)",
                     title=f"{style.point_label(strategy, block_size)}, {rate:g} req/s")
        timeline.grid(visible=False)
        columns = [("all steps", style.MEM_FRAC_KEY), ("saturated", style.MEM_FRAC_SAT_KEY)]
        for x, (_, keys) in enumerate(columns):
            bottom = 0.0
            for c in style.STACK_ORDER:
                value = summary[keys[c]] * 100
                if np.isfinite(value) and value > 0:
                    shares.bar(x, value, bottom=bottom, width=0.6, color=style.SLOT_STYLE[c][1],
                               hatch=style.SLOT_STYLE[c][2], edgecolor="black", linewidth=0.4)
                    bottom += value
        shares.set_xticks(range(len(columns)), [name for name, _ in columns])
        shares.set(ylim=(0, 100), title=f"batch {summary['mean_batch_size']:.1f} seqs, "
                                        f"{summary['throughput_req_s']:.2f} req/s")
        handles, labels = timeline.get_legend_handles_labels()
        fig.legend(handles[::-1], labels[::-1], loc="outside right upper")
        add_caption(fig, f"{model} · "
                         f"{summary['kv_slots']:,} KV slots · {workload}, {num_requests} requests · "
                         f"GPU preset {cfg.gpu}, {cfg.clock} clock · kernel none")
    return fig


def explorer(**fixed):
    """ipywidgets controls (strategy, block size, rate) over `explore`; `fixed` are its other arguments."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    strategy = widgets.Dropdown(options=registry.names(), value="paged", description="strategy")
    block_size = widgets.SelectionSlider(options=BLOCK_SIZES, value=16, description="block size")
    rate = widgets.FloatLogSlider(value=8.0, base=2, min=-1, max=6, step=0.5, description="req/s")
    output = widgets.Output()

    def redraw(_change=None) -> None:
        with output:
            output.clear_output(wait=True)
            fig = explore(strategy.value, block_size.value, rate.value, **fixed)
            display(fig)
            plt.close(fig)

    for control in (strategy, block_size, rate):
        control.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([strategy, block_size, rate]), output])
