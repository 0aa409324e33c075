"""The one look of every figure: sizes for a printed column, colors and labels per strategy (from
its registration) and per memory category, and a deterministic save (no timestamps inside the
PNG/PDF, so an unchanged figure rebuilds byte-identical)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from workbench.allocators import registry
from workbench.allocators.registry import Registration
from workbench.columns import MEM_FRAC_KEYS, MEM_FRAC_SAT_KEYS, SLOT_COLUMNS

COLUMN_WIDTH_IN = 3.4  # one column of a two-column paper
PAGE_WIDTH_IN = 7.0

RC = {
    "font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "legend.fontsize": 7, "xtick.labelsize": 7,
    "ytick.labelsize": 7, "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
    "grid.alpha": 0.3, "grid.linewidth": 0.5, "lines.linewidth": 1.4, "lines.markersize": 4,
    "legend.frameon": False, "savefig.dpi": 200, "savefig.bbox": "tight", "pdf.fonttype": 42,
    "svg.hashsalt": "workbench",
}

# the six-way partition of the pool (docs/memory.md), bottom to top of a stack: used memory, then the kinds of waste
SLOT_STYLE = {
    "token_slots": ("Token KV", "#009E73", ""),
    "reserved_slots": ("Reserved", "#F0E442", "//"),
    "internal_frag_slots": ("Internal frag.", "#D55E00", "xx"),
    "external_frag_slots": ("External frag.", "#CC79A7", ".."),
    "cached_slots": ("Prefix cache", "#56B4E9", ""),
    "free_slots": ("Free", "#DDDDDD", ""),
}
STACK_ORDER = ("token_slots", "reserved_slots", "internal_frag_slots", "external_frag_slots", "cached_slots",
               "free_slots")
MEM_FRAC_KEY = dict(zip(SLOT_COLUMNS, MEM_FRAC_KEYS, strict=True))
MEM_FRAC_SAT_KEY = dict(zip(SLOT_COLUMNS, MEM_FRAC_SAT_KEYS, strict=True))


def _registration(name: str) -> Registration | None:
    """The strategy's registration; None for a name no longer registered (old results still plot)."""
    return registry.get(name) if name in registry.names() else None


def strategy_label(name: str) -> str:
    reg = _registration(name)
    return reg.label if reg else name


def strategy_color(name: str) -> str | None:
    reg = _registration(name)
    return reg.color if reg else None


def strategy_marker(name: str) -> str:
    reg = _registration(name)
    return reg.marker if reg else "o"


def block_sized(name: str) -> bool:
    """Whether the strategy's block size belongs in its label (paged kernel mode)."""
    reg = _registration(name)
    return reg.block_sized if reg else False


def has_prefix_cache(name: str) -> bool:
    reg = _registration(name)
    return reg.prefix_cache if reg else False


@contextmanager
def figure_style() -> Iterator[None]:
    with plt.rc_context(RC):
        yield


def new_figure(nrows: int = 1, ncols: int = 1, *, width_in: float = COLUMN_WIDTH_IN,
               height_in: float = 2.4, **kwargs) -> tuple[Figure, object]:
    """A figure in the workbench style (call inside `figure_style()`); returns (figure, axes)."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(width_in, height_in), layout="constrained", **kwargs)
    return fig, axes


def save(fig: Figure, out_dir: Path, name: str) -> list[Path]:
    """Write NAME.png and NAME.pdf into out_dir (created if needed) without embedded dates; closes fig."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    with figure_style():
        fig.savefig(paths[0], metadata={"Software": None})
        fig.savefig(paths[1], metadata={"Creator": None, "Producer": None, "CreationDate": None})
    plt.close(fig)
    return paths


# short names of the workloads the shipped experiments use; anything else is shown as written
WORKLOAD_LABELS = {
    "lengths:sharegpt-vllm-sosp23-lengths": "ShareGPT",
    "lengths:alpaca-5000-subset": "Alpaca",
    "sharegpt-like": "ShareGPT-like",
    "alpaca-like": "Alpaca-like",
    "mooncake:mooncake-fast25-conversation": "Mooncake conversation",
    "mooncake:mooncake-fast25-conversation-full": "Mooncake conversation (all 12,031 requests)",
    "mooncake:mooncake-fast25-synthetic": "Mooncake synthetic (all 3,993 requests)",
    "mooncake:mooncake-fast25-toolagent": "Mooncake tool and agent (all 23,608 requests)",
    "azure:azure-llm-2023-conv": "Azure LLM inference 2023, conversation",
    "azure:azure-llm-2023-code": "Azure LLM inference 2023, code",
}


def workload_label(workload: str) -> str:
    return WORKLOAD_LABELS.get(workload, workload)


def page_sized(name: str) -> bool:
    """Whether the strategy's physical page size (`page_kib`) belongs in its label."""
    reg = _registration(name)
    return bool(reg) and "page_kib" in reg.options


def page_kib_of(row) -> int | None:
    """A summary row's `page_kib` (None for results written before the option existed)."""
    return getattr(row, "page_kib", None)


def page_label(page_kib: int) -> str:
    return f"{page_kib // 1024} MiB" if page_kib % 1024 == 0 else f"{page_kib} KiB"


def tick_label(strategy: str, block_size: int, page_kib: int | None = None) -> str:
    """A short two-line label for a bar: `Contig.\nmax`, `Paged\nB=16`, `vAttn\n64 KiB`."""
    reg = _registration(strategy)
    label = reg.tick_label if reg else strategy
    if page_sized(strategy) and page_kib is not None:
        return f"{label}\n{page_label(page_kib)}"
    return f"{label}\nB={block_size}" if block_sized(strategy) else label


def point_label(strategy: str, block_size: int, page_kib: int | None = None) -> str:
    """`Paged (16)` for paged strategies (the block size matters), `... (64 KiB)` for page-sized ones,
    the plain strategy label otherwise."""
    label = strategy_label(strategy)
    if page_sized(strategy) and page_kib is not None:
        return f"{label} ({page_label(page_kib)})"
    return f"{label} ({block_size})" if block_sized(strategy) else label
