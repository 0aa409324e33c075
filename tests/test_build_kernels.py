"""`python -m workbench.build_kernels` (run by `make test` before the tests) calls every Numba entry point
and every registered strategy: it keeps working as their signatures change."""

from __future__ import annotations

from workbench import build_kernels as build


def test_the_build_calls_every_numba_entry_point_and_strategy():
    took = build.build(("numba",))
    assert set(took) == {"numba"} and took["numba"] >= 0


def test_an_unknown_part_is_one_line(capsys):
    import pytest

    with pytest.raises(SystemExit) as exit_:
        build.main(["everything"])
    assert exit_.value.code == 2 and "invalid choice: 'everything'" in capsys.readouterr().err
