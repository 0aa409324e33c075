"""kv_layouts: what each attention layout stores and reads. Left: KV bytes per token (fp16, all layers) of
multi-head, grouped-query, sliding-window hybrid, latent (MLA) and latent plus sparse attention's indexer
keys (DSA). Middle: the token slots the same KV memory holds (the runs' `kv_slots`). Right: KV bytes one
decoding sequence reads per step against its context length, as the clock charges them (`step_cost`): a
window layer reads min(context, W) keys; sparse attention reads the indexer's key of every token plus its
top-k latent rows, so past k = 2,048 its reads grow by 132 bytes a token and layer instead of 1,152."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from workbench.clock.step_cost import CostMeter
from workbench.figures import style
from workbench.presets import MODELS

CONTEXTS = tuple(2**i for i in range(8, 18))  # 256 .. 131072 tokens
COLORS = ("#0072B2", "#56B4E9", "#009E73", "#D55E00", "#CC79A7")


def layout_label(name: str) -> str:
    """A model's attention layout, for the axes."""
    m = MODELS[name]
    if m.kv_layout == "latent":
        return "MLA + DSA" if m.index_topk else "MLA"
    if m.is_hybrid:
        return "sliding-window"
    return "MHA" if m.num_kv_heads == m.num_heads else "GQA"


def step_read_bytes(name: str, context: int, kv_dtype: str = "fp16") -> float:
    """KV bytes one sequence's decode step reads at `context` tokens, as the clock's cost meter charges them."""
    model = MODELS[name]
    meter = CostMeter(16, model.window_layer_fracs())
    meter.add(context - 1, 1, 0, +1)
    meter.decoded(1, 0)
    return meter.cost(1, [], [], 0, 0).kv_read_tokens * model.kv_bytes_per_token(kv_dtype)


def plot(summary: pd.DataFrame, sweep_dir: Path) -> Figure:
    fig, (left, middle, right) = style.new_figure(ncols=3, width_in=2 * style.COLUMN_WIDTH_IN, height_in=2.4)
    rows = summary.set_index("model").loc[[m for m in summary["model"] if m in MODELS]]
    labels = [f"{layout_label(m)}\n{m}" for m in rows.index]
    colors = COLORS[:len(rows)]
    per_token = [MODELS[m].kv_bytes_per_token(rows.loc[m, "kv_dtype"]) / 1024 for m in rows.index]
    left.bar(range(len(rows)), per_token, color=colors)
    left.set_ylabel("KV per token (KiB)")
    middle.bar(range(len(rows)), rows["kv_slots"].to_numpy() / 1e6, color=colors)
    middle.set_ylabel(f"Tokens in {rows['kv_gib'].iloc[0]:g} GiB (millions)")
    for ax in (left, middle):
        ax.set_xticks(range(len(rows)), labels, fontsize=5, rotation=30, ha="right")
    for name, color in zip(rows.index, colors, strict=True):
        read = np.array([step_read_bytes(name, c, rows.loc[name, "kv_dtype"]) for c in CONTEXTS])
        right.plot(CONTEXTS, read / 2**20, color=color, marker="o", ms=2, label=layout_label(name))
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xlabel("Context length (tokens)")
    right.set_ylabel("KV read per decode step (MiB)")
    right.legend(fontsize=6)
    return fig
