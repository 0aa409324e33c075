"""`python -m workbench.sweep`: the sweep CLI with the figures plugged in. An entry point is where
the layers meet: the sweep package itself never imports the figures package above it. The figures (and
matplotlib, 0.4 s) are imported only when a spec names a figure."""

from __future__ import annotations

from pathlib import Path

from workbench.clean_exit import run_cli


def _check(name: str) -> None:
    from workbench.figures.registry import check_name

    check_name(name)


def _draw(name: str, sweep_dir: Path) -> list[Path]:
    """The figure, drawn into the sweep's own directory."""
    from workbench.figures.build import draw_into

    return draw_into(name, sweep_dir, sweep_dir)


def run(argv: list[str] | None = None) -> int:
    from workbench.sweep.cli import main
    from workbench.sweep.hooks import FigureHooks

    return main(argv, figures=FigureHooks(check=_check, draw=_draw))


if __name__ == "__main__":  # spawned workers import this module as __mp_main__; they must not rerun the sweep
    raise SystemExit(run_cli(run))
