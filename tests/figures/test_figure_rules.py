"""The figure rules (tests/figures/figure_rules.py) catch what they say: a long legend, and coinciding series
drawn as two indistinguishable lines or without a caption naming them."""

from __future__ import annotations

import matplotlib.pyplot as plt

from tests.figures.figure_rules import MAX_LEGEND_ENTRIES, figure_problems


def test_a_legend_of_more_than_six_entries_is_refused():
    fig, ax = plt.subplots()
    for i in range(MAX_LEGEND_ENTRIES + 1):
        ax.plot([0, 1], [i, i + 1], label=f"series {i}")
    ax.legend()
    assert [p.split(" (")[0] for p in figure_problems(fig)] == [f"{MAX_LEGEND_ENTRIES + 1} legend entries"]
    ax.get_lines()[-1].remove()
    ax.legend()
    assert not figure_problems(fig)
    plt.close(fig)


def test_coinciding_series_are_drawn_once_or_beneath_a_narrower_one_with_a_caption():
    fig, ax = plt.subplots()
    ax.plot([0, 1, 2], [1, 2, 3], label="paged, lru")
    ax.plot([0, 1, 2], [1, 2, 3], label="radix, lru")
    ax.plot([0, 1, 2], [1, 2, 4], label="radix, fifo")
    (problem,) = figure_problems(fig)
    assert problem.startswith("'paged, lru' and 'radix, lru' coincide")
    lower, upper, _ = ax.get_lines()
    lower.set(linewidth=3.5, zorder=2)
    upper.set(linewidth=1.5, zorder=3)
    assert figure_problems(fig), "both show, but no caption names them"
    fig.text(0, 0, "'paged' (wide) lies under 'radix'")
    assert not figure_problems(fig)
    plt.close(fig)
