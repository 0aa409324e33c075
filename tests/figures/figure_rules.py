"""The rules every drawn figure keeps, registered (workbench.figures) or in a notebook: at most
MAX_LEGEND_ENTRIES entries in any legend, and series of one panel that coincide point for point are drawn
once, under one label joined by `=` (`workbench.plot.draw_once`), or one beneath the other, the lower one
wider so that it shows at the edges of the upper (`workbench.figures.prefix_policies`, where caches
coincide in one panel but not in another), with a caption that names both."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

MAX_LEGEND_ENTRIES = 6  # more and the eye finds nothing


def _points(line) -> tuple[np.ndarray, np.ndarray] | None:
    try:
        x = np.asarray(line.get_xdata(), dtype=float)
        y = np.asarray(line.get_ydata(), dtype=float)
    except (TypeError, ValueError):  # categorical or date data: not compared
        return None
    return (x, y) if x.size > 1 else None


def figure_problems(fig: Figure) -> list[str]:
    """What `fig` breaks of the rules, one line each (empty when it keeps them)."""
    problems = []
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
    for legend in legends:
        entries = [t.get_text() for t in legend.get_texts()]
        if len(entries) > MAX_LEGEND_ENTRIES:
            problems.append(f"{len(entries)} legend entries (at most {MAX_LEGEND_ENTRIES}): {entries}")
    for ax in fig.axes:
        drawn = [(line, pts) for line in ax.get_lines() if line.get_visible() and (pts := _points(line)) is not None]
        for i, (a, (ax_, ay)) in enumerate(drawn):
            for b, (bx, by) in drawn[i + 1:]:
                if ax_.shape == bx.shape and ay.shape == by.shape and np.array_equal(ax_, bx, equal_nan=True) \
                        and np.array_equal(ay, by, equal_nan=True) and not _both_show(fig, a, b):
                    problems.append(f"'{a.get_label()}' and '{b.get_label()}' coincide in panel "
                                    f"'{ax.get_title()}': draw them once, named with '=', and say so in the caption")
    return problems


def _both_show(fig: Figure, a, b) -> bool:
    """Coinciding lines drawn one beneath the other: the lower one wider, and a caption naming both (by
    their label's first part: a panel's label adds what it draws, `cache, policy`)."""
    lower, upper = sorted((a, b), key=lambda line: line.get_zorder())
    if lower.get_zorder() == upper.get_zorder() or lower.get_linewidth() <= upper.get_linewidth():
        return False
    caption = "\n".join(t.get_text() for t in fig.texts)
    return all(line.get_label().split(",")[0] in caption for line in (lower, upper))
