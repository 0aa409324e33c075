"""The figures a sweep draws when it ends, reached without the sweep package importing the figures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FigureHooks:
    """How the CLI reaches the figures package: `check(name)` raises ValueError for an unknown figure;
    `draw(name, sweep_dir)` plots the finished sweep into sweep_dir and returns the files written."""

    check: Callable[[str], None]
    draw: Callable[[str, Path], list[Path]]
