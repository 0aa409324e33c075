"""No summary holds NaN: the run's, the fleet's and every replica's figures are finite numbers (or text)
for every strategy and every router on edge workloads: replicas that serve nothing, more replicas than
requests, a single request, a queue that never builds up, a decode replica no prompt reaches. A figure
with nothing to measure is 0; an idle pool's memory is all free."""

from __future__ import annotations

import json
import math

import pytest

import workbench as wb
from tests.engine.conftest import SMALL_MODEL, SMALL_OPTIONS
from workbench import columns as C
from workbench.allocators import registry
from workbench.config import ROUTER_NAMES
from workbench.results import summary_problem

EDGE = {  # name: flags of an edge workload (a tiny rate: no step is ever saturated)
    "one request": {"num_requests": 1},
    "more replicas than requests": {"num_requests": 3, "replicas": 5},
    "one replica of two gets all": {"num_requests": 2, "replicas": 2, "router": "session"},
    "more decode replicas than requests": {"num_requests": 2, "prefill_replicas": 1, "decode_replicas": 3},
}


def flags(strategy: str, **edge) -> dict:
    options = {k: v for k, v in SMALL_OPTIONS.items() if k in registry.get(strategy).options}
    return {"model": SMALL_MODEL, "kv_slots": 2048, "block_size": 8, "kernel": "none", "workload": "alpaca-like",
            "rate": 0.01, "seed": 3, "strategy": strategy, **options, **edge}


def nan_paths(value, at: str = "") -> list[str]:
    """Where a NaN (or an infinity) lies in a summary, its nested per_replica included."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [at]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in nan_paths(v, f"{at}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in nan_paths(v, f"{at}[{i}]")]
    return []


def check_summary(figures: dict) -> None:
    assert nan_paths(figures) == []
    json.loads(json.dumps(figures, allow_nan=False))  # strict JSON: summary.json has no NaN either
    assert summary_problem(figures) is None
    for one in figures.get("per_replica", []):
        assert sum(one[k] for k in C.MEM_FRAC_KEYS) == pytest.approx(1.0)  # an idle pool is all free
        assert summary_problem({**one, "sim_wall_s": 0.0}) is None


def servable(cfg_flags: dict) -> bool:
    try:
        wb.api.run_config(**cfg_flags)
    except wb.ConfigError:  # a strategy that cannot take this shape (disaggregated needs one sequence per
        return False        # request; some strategies refuse a pool option): not an edge of this test
    return True


@pytest.mark.parametrize("edge", EDGE)
@pytest.mark.parametrize("strategy", registry.names())
def test_no_strategy_writes_nan_on_an_edge_workload(strategy, edge):
    cfg_flags = flags(strategy, **EDGE[edge])
    if not servable(cfg_flags):
        pytest.skip(f"{strategy} does not take {edge}")
    check_summary(wb.run(**cfg_flags).metrics)


@pytest.mark.parametrize("router", ROUTER_NAMES)
def test_no_router_leaves_a_nan_in_its_replicas(router):
    for edge in ({"num_requests": 2, "replicas": 4}, {"num_requests": 2, "prefill_replicas": 2, "decode_replicas": 2}):
        result = wb.run(**flags("paged-prefix", router=router, **edge))
        assert sum(one["num_finished"] for one in result.metrics["per_replica"]) >= 2
        check_summary(result.metrics)
