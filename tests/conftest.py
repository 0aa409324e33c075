from __future__ import annotations

from pathlib import Path

import pytest

from workbench.traces import locate


@pytest.fixture
def real_trace():
    """`real_trace(NAME)` is the full public trace's file when it is already here (cache or shared
    folder); otherwise the test is skipped with one line that says how to get it."""

    def find(name: str) -> Path:
        path = locate(name)
        if path is None:
            pytest.skip(f"needs the full trace {name}: python -m workbench.traces fetch {name}")
        return path

    return find
