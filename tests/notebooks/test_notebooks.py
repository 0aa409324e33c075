"""Every notebook executes top to bottom at its small size, and is stored without outputs."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from workbench.paths import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))


def test_the_notebooks_exist():
    assert [p.stem for p in NOTEBOOKS] == ["01-quickstart", "02-fragmentation-anatomy", "03-block-size-tradeoff",
                                           "04-prefix-sharing", "07-prefix-caching-policies"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path):
    book = nbformat.read(path, as_version=4)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip the outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_executes(path, tmp_path, monkeypatch):
    # the kernel of this environment, even when a user-level `python3` kernelspec points elsewhere
    venv_jupyter = Path(sys.prefix) / "share" / "jupyter"
    assert (venv_jupyter / "kernels" / "python3").is_dir(), "run: python -m ipykernel install --sys-prefix"
    monkeypatch.setenv("JUPYTER_PATH", str(venv_jupyter))
    monkeypatch.setenv("WORKBENCH_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("WORKBENCH_RUNS_DIR", str(tmp_path))
    book = nbformat.read(path, as_version=4)
    client = NotebookClient(book, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError, with the cell and traceback, on the first failing cell
    errors = [out for cell in book.cells if cell.cell_type == "code" for out in cell.outputs
              if out.output_type == "error"]
    assert not errors
    images = [out for cell in book.cells if cell.cell_type == "code" for out in cell.outputs
              if "image/png" in out.get("data", {})]
    assert images, f"{path.name} shows no figure"
    assert list((tmp_path / "notebooks").iterdir()), "the notebook wrote its runs under WORKBENCH_RUNS_DIR"
