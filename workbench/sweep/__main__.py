"""`python -m workbench.sweep`: the sweep CLI with the figures plugged in. An entry point is where
the layers meet: the sweep package itself never imports the figures package above it."""

from __future__ import annotations

from workbench.clean_exit import run_cli


def run(argv: list[str] | None = None) -> int:
    from workbench.figures.build import sweep_hooks
    from workbench.sweep.cli import main

    return main(argv, figures=sweep_hooks())


if __name__ == "__main__":  # spawned workers import this module as __mp_main__; they must not rerun the sweep
    raise SystemExit(run_cli(run))
