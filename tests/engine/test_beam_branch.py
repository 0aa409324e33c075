"""`--beam-branch-frac`: beams that fork at fewer steps share fewer blocks, verified against the reference."""

from __future__ import annotations

from tests.engine.conftest import replace, simulate_checked, small_config


def test_fewer_branch_points_share_fewer_blocks():
    cfg = small_config(strategy="paged", workload="alpaca-like", beam_width=4, num_requests=8)
    saving = {}
    for frac in (1.0, 0.3, 0.0):
        result = simulate_checked(replace(cfg, beam_branch_frac=frac))
        assert result.summary["num_finished"] == 8
        saving[frac] = result.summary["block_sharing_saving_frac"]
    assert saving[1.0] > saving[0.3] > saving[0.0] > 0  # the prompt's full blocks stay shared at 0
    assert simulate_checked(cfg).summary["block_sharing_saving_frac"] == saving[1.0]
