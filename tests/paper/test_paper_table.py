"""`python -m workbench.paper`: every row of the reduced table is computed from real runs, and the
paper's numbers come only from values.yaml."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from tests.conftest import skip_without_traces_of
from workbench.paper import rows as R
from workbench.paper.__main__ import EXPERIMENTS_DIR, experiment_names, run_experiments, scaled
from workbench.paths import REPO_ROOT
from workbench.sweep import load_spec


def _expected_items(values):
    """One row per Fig. 2 segment and per Fig. 13 system, one per entry elsewhere."""
    for section, entry in values.items():
        for value in entry["rows"].values():
            yield from (value if section in ("fig2", "fig13") else [value])


class InlineExecutor:
    """Runs the points one after another in this process (no worker start-up)."""

    threads_per_task = 1

    def map_unordered(self, fn, tasks):
        for task in tasks:
            yield fn(task)


@pytest.fixture(scope="module")
def reduced_table(tmp_path_factory):
    values = R.load_values()
    out = tmp_path_factory.mktemp("paper")
    names = experiment_names(values)
    skip_without_traces_of(*(EXPERIMENTS_DIR / name for name in names))
    # the shared-prefix points need ~300 requests before a queue builds; the rest ~100
    prefix = values["prefix"]["experiment"]
    tables = run_experiments([n for n in names if n != prefix], out, executor=InlineExecutor(), frac=0.04,
                             progress=False)
    tables |= run_experiments([prefix], out, executor=InlineExecutor(), frac=0.2, progress=False)
    return values, tables, R.build_rows(values, tables)


def test_every_value_row_appears_once_with_a_number_and_a_verdict(reduced_table):
    values, _, rows = reduced_table
    figures = {r.figure for r in rows}
    assert {R._cite_short(e) for e in values.values()} == figures
    assert len(rows) == sum(1 for _ in _expected_items(values))
    for r in rows:
        assert not math.isnan(r.workbench), r
        assert (EXPERIMENTS_DIR / r.experiment).is_file()


def test_the_committed_table_explains_every_row_outside_its_tolerance():
    text = (REPO_ROOT / "figures" / "paper_table.md").read_text()
    table_rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(table_rows) == sum(1 for _ in _expected_items(R.load_values()))
    explained = text.split("Outside the tolerance:")[-1]
    for cells in table_rows:
        if cells[6] == "no":
            figure, item = cells[0].removeprefix("| "), cells[1]
            line = next(x for x in explained.splitlines() if x.startswith(f"- **{figure}, {item}**: "))
            assert len(line.split("**: ", 1)[1]) > 20, line


def test_markdown_lists_every_row_and_every_gap(reduced_table):
    _, _, rows = reduced_table
    text = R.markdown(rows)
    assert sum(line.startswith("| ") for line in text.splitlines()) == len(rows) + 1  # plus the header
    for r in rows:
        assert r.item in text
        if not r.ok:
            assert r.reason in text


def test_rows_follow_the_values_file(reduced_table):
    """The same tables with an edited paper value give an edited row: the number is read, not typed."""
    values, tables, rows = reduced_table
    before = next(r for r in rows if r.item == "sharegpt-2rps: paged")
    edited = {**values, "fig13": {**values["fig13"], "rows": {
        **values["fig13"]["rows"], "sharegpt-2rps": {**values["fig13"]["rows"]["sharegpt-2rps"], "paged": 1.0}}}}
    after = next(r for r in R.fig13(edited["fig13"], tables["paper_fig13.yaml"]) if r.item == before.item)
    assert after.paper == "1" and after.workbench == before.workbench


def test_scaling_keeps_every_point_and_cuts_requests():
    for name in experiment_names(R.load_values()):
        spec = load_spec(EXPERIMENTS_DIR / name)
        small = scaled(spec, 0.1)
        full_points, small_points = spec.points(), small.points()
        assert len(full_points) == len(small_points)
        for full, cut in zip(full_points, small_points, strict=True):
            assert cut.config.num_requests < full.config.num_requests


def test_no_paper_number_in_the_computing_code():
    """Every float literal in the row code is a unit conversion (100) or a neutral value, not a result."""
    allowed = {0, 1, 100}
    for path in (Path(R.__file__), Path(R.__file__).with_name("__main__.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, float):
                assert node.value in allowed or node.value < 1, f"{path.name}: literal {node.value}"
