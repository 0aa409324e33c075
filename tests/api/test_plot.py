"""`workbench.plot`: each figure of a Result, a list of them or a summary table draws that data."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.container import BarContainer

import workbench as wb
from tests.engine.conftest import SMALL_MODEL
from tests.figures.figure_rules import figure_problems
from workbench.columns import SLOT_COLUMNS
from workbench.figures import style

TINY = {"model": SMALL_MODEL, "kv_slots": 2048, "kernel": "none", "workload": "sharegpt-like", "num_requests": 30}


@pytest.fixture(scope="module")
def results() -> list:
    return [wb.run(strategy=strategy, rate=rate, **TINY) for strategy in ("contiguous-max", "paged")
            for rate in (2.0, 40.0)]


def test_memory_bars_are_the_results_partition(results):
    fig = wb.plot.memory(results)
    ax = fig.axes[0]
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers if isinstance(c, BarContainer)}
    summary = pd.concat([r.summary for r in results])
    saturated = bool((summary["saturated_step_frac"] > 0).all())  # else the _sat figures are 0: all steps
    keys = style.MEM_FRAC_SAT_KEY if saturated else style.MEM_FRAC_KEY
    for column in SLOT_COLUMNS:
        expected = summary[keys[column]].to_numpy(dtype=float) * 100
        label = style.SLOT_STYLE[column][0]
        if label in bars:
            np.testing.assert_allclose(bars[label], expected, rtol=1e-12)
        else:
            assert not np.any(expected > 0), column
    np.testing.assert_allclose(np.sum(list(bars.values()), axis=0), 100.0, rtol=1e-9)
    assert "kernel none" in fig.texts[-1].get_text()  # the caption line
    plt.close(fig)


def test_latency_vs_rate_lines_are_the_results(results):
    fig = wb.plot.latency_vs_rate(results)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert set(lines) == {"Contiguous (max)", "Paged (16)"}
    for label, strategy in (("Contiguous (max)", "contiguous-max"), ("Paged (16)", "paged")):
        mine = [r.metrics for r in results if r.config.strategy == strategy]
        np.testing.assert_array_equal(lines[label].get_xdata(), [2.0, 40.0])
        np.testing.assert_array_equal(lines[label].get_ydata(), [f["normalized_latency_s_per_tok"] for f in mine])
    plt.close(fig)
    with pytest.raises(ValueError, match="rate"):
        wb.plot.latency_vs_rate(wb.run(**{**TINY, "num_requests": 5}))


def test_timeline_stacks_each_results_steps(results, tmp_path):
    fig = wb.plot.timeline(results[:2])
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2
    for ax, result in zip(axes, results[:2], strict=True):
        layers = ax.collections
        top = layers[-1].get_paths()[0].vertices[:, 1].max()
        assert top == pytest.approx(100.0)
        steps = result.steps
        token_percent = steps["token_slots"].to_numpy() / result.metrics["kv_slots"] * 100
        first = layers[0].get_paths()[0].vertices[:, 1]
        assert first.max() == pytest.approx(token_percent.max())
    plt.close(fig)
    # a sweep's table reads the steps from its points
    table = wb.sweep({"name": "t", "base": {**TINY, "rate": 40.0}, "axes": {"strategy": ["paged"]}}, tmp_path / "s",
                     jobs=1, progress=False)
    fig = wb.plot.timeline(table, tmp_path / "s")
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == ["Paged (16)"]
    plt.close(fig)
    fig = wb.plot.timeline(table)  # the table says where its sweep ran
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == ["Paged (16)"]
    with pytest.raises(ValueError, match="sweep_dir"):
        wb.plot.timeline(pd.DataFrame(table.to_dict("list")))
    plt.close(fig)


def test_anything_else_is_refused():
    with pytest.raises(TypeError, match="expected a Result"):
        wb.plot.memory({"strategy": "paged"})
    with pytest.raises(ValueError, match="no rows"):
        wb.plot.memory(pd.DataFrame())


def test_a_registered_figure_draws_from_a_sweep_table_as_from_its_directory(tmp_path):
    from workbench.figures.build import draw

    table = wb.sweep({"name": "f", "base": {**TINY, "rate": 40.0},
                      "axes": {"strategy": ["contiguous-max", "paged"]}}, tmp_path / "s", jobs=1, progress=False)
    for name in ("memory_waste", "fragmentation_timeline"):
        mine, theirs = wb.plot.figure(name, table), draw(name, tmp_path / "s")
        assert [t.get_text() for t in mine.texts] == [t.get_text() for t in theirs.texts]
        for a, b in zip(mine.axes, theirs.axes, strict=True):
            assert [p.get_height() for p in a.patches] == [p.get_height() for p in b.patches]
            assert [c.get_paths()[0].vertices.tolist() for c in a.collections] == \
                   [c.get_paths()[0].vertices.tolist() for c in b.collections]
        plt.close(mine)
        plt.close(theirs)


def test_draw_once_draws_coinciding_series_once_and_says_so():
    fig, ax = plt.subplots()
    notes = wb.plot.draw_once(ax, [("lru", [1, 2], [3, 4], {"color": "red"}), ("fifo", [1, 2], [3, 5], {}),
                                   ("lfu", [1, 2], [3, 4], {"color": "blue"}), ("depth", [1], [3], {})])
    assert [line.get_label() for line in ax.get_lines()] == ["lru = lfu", "fifo", "depth"]
    assert ax.get_lines()[0].get_color() == "red"  # the first series' style
    assert notes == ["lru and lfu coincide at every point: drawn once"]
    assert not figure_problems(fig)
    plt.close(fig)
