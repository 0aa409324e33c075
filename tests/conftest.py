from __future__ import annotations

from pathlib import Path

import pytest

# The trace registry is imported inside the helpers, not here: every test collects this file, and the
# GPU tests run on images without the trace store's dependencies (tqdm).


@pytest.fixture
def real_trace():
    """`real_trace(NAME)` is the full public trace's file when it is already here (cache or shared
    folder); otherwise the test is skipped with one line that says how to get it."""
    from workbench.traces import locate

    def find(name: str) -> Path:
        path = locate(name)
        if path is None:
            pytest.skip(f"needs the full trace {name}: python -m workbench.traces fetch {name}")
        return path

    return find


def skip_without_traces_of(*experiment_yamls: Path) -> None:
    """Skip, with one line that says how to get them, when a registry trace these built-in experiments
    read is not here (cache or shared folder): tests never download."""
    from workbench.traces import TRACES, locate

    text = "".join(path.read_text() for path in experiment_yamls)
    missing = [name for name in TRACES if f":{name}" in text and locate(name) is None]
    if missing:
        pytest.skip(f"needs the full traces {', '.join(missing)}: python -m workbench.traces fetch NAME")


def shared_folder_of(name: str, purpose: str) -> Path:
    """The shared traces folder holding trace `name`; the test is skipped with one line when the
    folder (../shared/traces) or the trace's own sub-folder is not there."""
    from workbench.paths import shared_traces_dir
    from workbench.traces import TRACES

    folder = shared_traces_dir()
    if folder is None:
        pytest.skip(f"{purpose} ../shared/traces, which is not here (set WORKBENCH_SHARED_TRACES)")
    entry = TRACES[name]
    if not (folder / entry.folder).is_dir():
        pytest.skip(f"{name} is not among the shared traces (its own folder {entry.folder} is not there)")
    return folder
