"""Every strategy drives the real Numba kernels with verification at every step (issue 5 matrix)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import strategy_workload_grid
from tests.engine.conftest import simulate_checked, small_config
from workbench import columns as C
from workbench.allocators import registry

WORKLOADS = {
    "chat": dict(workload="sharegpt-like", num_requests=12, rate=20.0, kv_dtype="fp32"),
    "parallel-n4": dict(workload="alpaca-like", n=4, kv_dtype="fp16"),
    "system-prompt": dict(workload="system-prompt:k=2,system=40,lengths=alpaca", kv_dtype="bf16"),
}


def check_run(result, cfg):
    steps, requests, summary = result.steps, result.requests, result.summary
    # the six-way partition holds exactly at every step
    parts = steps[list(C.SLOT_COLUMNS)].to_numpy().sum(axis=1)
    assert (parts == summary["kv_slots"]).all()
    assert (steps[list(C.SLOT_COLUMNS)].to_numpy() >= 0).all()
    assert (steps["logical_token_slots"] >= steps["token_slots"]).all()
    # every request finished, none vanished
    assert list(requests["status"].unique()) == ["finished"]
    assert summary["num_finished"] == cfg.num_requests
    assert requests["num_preemptions"].sum() == summary["num_preemptions"]  # the step rows count every one
    assert (requests["first_token_s"] >= requests["arrival_s"]).all()
    assert (requests["finish_s"] >= requests["first_token_s"]).all()
    # the kernels ran and were checked against the reference
    assert summary["kernel_backend"] == "numba"
    tol = 1e-5 if cfg.kv_dtype == "fp32" else 1e-2
    assert 0 <= summary["verify_max_rel_err"] <= tol
    # each step lasts dt_s; idle gaps (nothing to run until the next arrival) only add time
    t, dt = steps["t_s"].to_numpy(), steps["dt_s"].to_numpy()
    assert (dt > 0).all()
    assert (np.diff(t) >= dt[1:] * (1 - 1e-12)).all()


def verify_with_kernels(strategy: str, workload: str) -> None:
    """Run the strategy on one of WORKLOADS with the Numba kernels verified at every step and its
    integrity checked before every snapshot; check what its registration promises."""
    reg = registry.get(strategy)
    cfg = small_config(strategy=strategy, **WORKLOADS[workload])
    result = simulate_checked(cfg)
    check_run(result, cfg)
    if workload == "parallel-n4" and reg.kernel_mode == "paged":
        # samples share the prompt: fewer physical slots than logical ones, copy-on-write on divergence
        assert result.summary["sharing_saving_frac"] > 0
        assert result.summary["block_sharing_saving_frac"] > 0
        assert result.summary["cow_copies"] > 0
    if workload == "system-prompt" and reg.prefix_cache:
        assert result.summary["prefix_hit_tokens"] > 0
        assert result.requests["prefix_hit_tokens"].sum() == result.summary["prefix_hit_tokens"]


@pytest.mark.parametrize(("strategy", "workload"), strategy_workload_grid(registry.names(), sorted(WORKLOADS)))
def test_strategy_with_kernels_verifies_every_step(strategy, workload):
    verify_with_kernels(strategy, workload)
