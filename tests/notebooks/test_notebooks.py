"""Every notebook executes top to bottom at its small size, and is stored with the outputs of a full-size
run (`make notebooks`), so that it reads with its figures where it is hosted."""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

import nbformat
import pytest

from tests.conftest import skip_without_traces_of
from workbench.experiments import builtin_dir
from workbench.notebook import notebook_client
from workbench.paths import REPO_ROOT

NOTEBOOKS = sorted((REPO_ROOT / "notebooks").glob("*.ipynb"))


def _code_cells(book):
    return [cell for cell in book.cells if cell.cell_type == "code"]


def _images(book):
    return [out for cell in _code_cells(book) for out in cell.outputs if "image/png" in out.get("data", {})]


def test_the_notebooks_exist():
    assert [p.stem for p in NOTEBOOKS] == ["00-paging-by-hand", "01-quickstart", "02-fragmentation-anatomy",
                                           "03-block-size-tradeoff", "04-prefix-sharing", "05-hybrid-models",
                                           "06-reproducing-the-paper", "07-prefix-caching-policies",
                                           "08-explorer", "09-fleet", "10-latent-models",
                                           "11-speculation-and-admission-order", "12-recurrent-state"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_with_full_size_outputs(path):
    book = nbformat.read(path, as_version=4)
    assert book.metadata.get("workbench", {}).get("size") == "full", f"{path.name}: run make notebooks"
    for cell in _code_cells(book):
        assert cell.execution_count is not None, f"{path.name}: a cell was not executed; run make notebooks"
        assert not [out for out in cell.outputs if out.output_type == "error"], f"{path.name}: stored an error"
    assert _images(book), f"{path.name} shows no figure"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_first_code_cell_is_for_the_reader(path):
    first = _code_cells(nbformat.read(path, as_version=4))[0].source
    assert "WORKBENCH_" not in first and "os.environ" not in first and "SMALL" not in first


# a notebook calls the public API (workbench.run, workbench.sweep, workbench.plot): it neither removes
# directories nor builds the paths of runs itself
PLUMBING = ("rmtree", "run_sweep(", "LocalExecutor(", "/ \"points\"", "engine.run(", "read_parquet(")
API_NOTEBOOKS = ["01-quickstart", "02-fragmentation-anatomy", "03-block-size-tradeoff", "04-prefix-sharing",
                 "05-hybrid-models", "06-reproducing-the-paper", "07-prefix-caching-policies", "09-fleet",
                 "10-latent-models", "11-speculation-and-admission-order", "12-recurrent-state"]


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem in API_NOTEBOOKS], ids=lambda p: p.stem)
def test_a_notebook_uses_the_api_not_the_plumbing(path):
    source = "".join(cell.source for cell in _code_cells(nbformat.read(path, as_version=4)))
    assert "import workbench as wb" in source
    assert not [word for word in PLUMBING if word in source]


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem in API_NOTEBOOKS], ids=lambda p: p.stem)
def test_a_notebook_names_the_folder_of_each_sweep(path):
    """`out=nb.runs_dir() / NAME` in every `wb.sweep(...)` call: where a notebook's sweeps go is said in the
    call, not by an environment variable that the helper would set for the whole process."""
    for cell in _code_cells(nbformat.read(path, as_version=4)):
        source = "\n".join("#" + line[1:] if line.startswith("%") else line for line in cell.source.split("\n"))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "wb.sweep":
                out = [k.value for k in node.keywords if k.arg == "out"]
                assert out and ast.unparse(out[0]).startswith("nb.runs_dir() / "), ast.unparse(node)[:200]


def _experiments_run_by(book) -> list[Path]:
    """The built-in experiments a notebook runs: named in its cells, and the paper's when it runs them
    all (`run_experiments`). Traces a notebook opens itself go through `workbench.notebook.trace`, which
    copes with their absence at the small size."""
    source = "".join(cell.source for cell in _code_cells(book))
    return [path for path in sorted(builtin_dir().glob("*.yaml"))
            if path.name in source or ("run_experiments(" in source and path.name.startswith("paper_"))]


# Run before a notebook's first cell: every figure it shows or saves (each goes through print_figure) is held
# to the figure rules (tests/figures/figure_rules.py) as it is drawn, under the number of the cell that drew it.
CHECK_FIGURES = """
import matplotlib.backend_bases
from IPython import get_ipython
from tests.figures.figure_rules import figure_problems

_figure_problems = []
_print_figure = matplotlib.backend_bases.FigureCanvasBase.print_figure


def _checked_print_figure(canvas, *args, **kwargs):
    cell = get_ipython().execution_count - 1  # the notebook's own code cells count from 1
    _figure_problems.extend(f"code cell {cell}: {problem}" for problem in figure_problems(canvas.figure))
    return _print_figure(canvas, *args, **kwargs)


matplotlib.backend_bases.FigureCanvasBase.print_figure = _checked_print_figure
"""
REPORT_FIGURES = "import json; print(json.dumps(_figure_problems))"


# Small as it is, the paper notebook reruns every experiment of the paper table (tests/paper runs them
# too, on a reduced table): it executes in the full run only. So do the costliest of the others at their small
# size (6-11 s of CPU each, 3 of them a kernel's start and imports): the prefix-caching policies and the fleet,
# whose runs tests/engine, tests/allocators/prefix and tests/fleet cover in the quick run, and the block
# sizes, hybrid models, speculation and recurrent state, whose figures tests/figures builds from tiny sweeps
# through the same API (fig_block_size, fig_hybrid, fig_spec_decode, fig_admission_order, fig_recurrent_state)
# and whose runs tests/engine covers. The quick run executes the other six.
SLOW_NOTEBOOKS = {"03-block-size-tradeoff", "05-hybrid-models", "06-reproducing-the-paper",
                  "07-prefix-caching-policies", "09-fleet", "11-speculation-and-admission-order",
                  "12-recurrent-state"}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.stem in SLOW_NOTEBOOKS else p
                                  for p in NOTEBOOKS], ids=lambda p: p.stem)
def test_executes(path, tmp_path, monkeypatch):
    # the kernel of this environment, even when a user-level `python3` kernelspec points elsewhere
    venv_jupyter = Path(sys.prefix) / "share" / "jupyter"
    assert (venv_jupyter / "kernels" / "python3").is_dir(), "run: python -m ipykernel install --sys-prefix"
    monkeypatch.setenv("JUPYTER_PATH", str(venv_jupyter))
    # the kernel imports the package under test, not another installed copy
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("WORKBENCH_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("WORKBENCH_RUNS_DIR", str(tmp_path))
    book = nbformat.read(path, as_version=4)
    skip_without_traces_of(*_experiments_run_by(book))
    for cell in _code_cells(book):
        cell.outputs = []
    book.cells.insert(0, nbformat.v4.new_code_cell(CHECK_FIGURES))
    book.cells.append(nbformat.v4.new_code_cell(REPORT_FIGURES))
    # raises CellExecutionError, with the cell and traceback, on the first failing cell
    notebook_client(book, path.parent, timeout_s=300).execute()
    errors = [out for cell in _code_cells(book) for out in cell.outputs if out.output_type == "error"]
    assert not errors
    assert _images(book), f"{path.name} shows no figure"
    (report,) = [out for out in book.cells[-1].outputs if out.output_type == "stream"]
    problems = json.loads(report.text)
    assert not problems, f"{path.name}: its figures break the figure rules: {problems}"
    source = "".join(cell.source for cell in _code_cells(book))
    if "runs_dir()" in source or "wb.sweep(" in source:
        assert list(tmp_path.iterdir()), "the notebook wrote its sweeps under WORKBENCH_RUNS_DIR"
