"""Series of one panel that coincide point for point: grouped, so that a figure draws them once under one
name joined by '=' and its caption says so (the figure rules, tests/figures/figure_rules.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def coinciding(series: Sequence[tuple[str, Any, Any, dict[str, Any]]]
               ) -> list[tuple[list[str], np.ndarray, np.ndarray, dict[str, Any]]]:
    """Pure. `series` grouped by equal points, in order: (labels, x, y, the first one's line style) each."""
    groups: list[tuple[list[str], np.ndarray, np.ndarray, dict[str, Any]]] = []
    for label, x, y, line_style in series:
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        same = next((g for g in groups if g[1].shape == x.shape and g[2].shape == y.shape
                     and np.array_equal(g[1], x, equal_nan=True) and np.array_equal(g[2], y, equal_nan=True)), None)
        if same is None:
            groups.append(([label], x, y, line_style))
        else:
            same[0].append(label)
    return groups


def coincidence_notes(groups) -> list[str]:
    """A caption sentence per group of `coinciding` with more than one series."""
    return [f"{' and '.join(labels)} coincide at every point: drawn once" for labels, *_ in groups if len(labels) > 1]
