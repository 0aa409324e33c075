"""Every registered strategy is drawn from its registration: label, tick label, colour, marker."""

from __future__ import annotations

import matplotlib.colors
import matplotlib.markers
import pytest

from workbench.allocators import registry
from workbench.figures import style


def check_strategy_style(name: str) -> None:
    reg = registry.get(name)
    assert style.strategy_label(name) == reg.label
    assert style.strategy_color(name) == reg.color and matplotlib.colors.is_color_like(reg.color)
    assert style.strategy_marker(name) == reg.marker and reg.marker in matplotlib.markers.MarkerStyle.markers
    assert style.has_prefix_cache(name) == reg.prefix_cache
    # the block size is part of a block-sized strategy's labels, and only of those
    assert style.tick_label(name, 32) == (f"{reg.tick_label}\nB=32" if reg.block_sized else reg.tick_label)
    assert style.point_label(name, 32) == (f"{reg.label} (32)" if reg.block_sized else reg.label)


@pytest.mark.parametrize("name", registry.names())
def test_every_strategy_is_styled_from_its_registration(name):
    check_strategy_style(name)


def test_strategies_are_told_apart():
    regs = registry.registrations()
    assert len({r.color for r in regs}) == len(regs)
    assert len({r.label for r in regs}) == len(regs)


def test_a_strategy_no_longer_registered_still_plots_under_its_name():
    assert style.strategy_label("retired") == "retired" and style.strategy_color("retired") is None
    assert style.tick_label("retired", 16) == "retired"
