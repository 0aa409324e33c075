"""Randomized fleets (hypothesis): any strategy, router, fleet size, colocated or disaggregated, with or without a
shared tier, preemption mode and chunked prefill. Every replica's strategy keeps its integrity after every step,
every replica's six-way partition is exact, every request ends once (finished or rejected) and every preemption
is in a step row."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.conftest import checked_strategy, small_config
from workbench import columns as C
from workbench.allocators import registry
from workbench.config import ROUTER_NAMES
from workbench.engine.simulation import simulate_fleet
from workbench.workload import build_workload

NUM_REQUESTS = 16

FLEETS = st.fixed_dictionaries(dict(
    strategy=st.sampled_from(registry.names()), block_size=st.sampled_from([1, 8, 16]),
    kv_slots=st.integers(768, 3000), router=st.sampled_from(ROUTER_NAMES),
    # (replicas, prefill replicas, decode replicas): colocated, or disaggregated (replicas = their sum)
    layout=st.sampled_from([(1, 0, 0), (2, 0, 0), (3, 0, 0), (2, 1, 1), (3, 1, 2), (3, 2, 1)]),
    shared_tier=st.booleans(), n=st.sampled_from([1, 2]), preemption=st.sampled_from(["recompute", "swap"]),
    chunked_prefill=st.booleans(),
    workload=st.sampled_from(["sharegpt-like", "system-prompt:k=3,system=30,lengths=alpaca",
                              "multi-turn:turns=3,think=0.2,lengths=alpaca"]),
    seed=st.integers(0, 2**16)))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FLEETS)
def test_random_fleets_keep_every_invariant(fleet):
    check_random_fleet(**fleet)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FLEETS)
def test_more_random_fleets_keep_every_invariant(fleet):
    check_random_fleet(**fleet)


# With the kernels: every replica's attention verified against the reference at every step (after shipped KV,
# shared-tier loads, swaps and copies). Full run only.
@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FLEETS)
def test_random_fleets_with_verified_kernels(fleet):
    check_random_fleet(**fleet, kernel="numba")


def check_random_fleet(strategy, block_size, kv_slots, router, layout, shared_tier, n, preemption, chunked_prefill,
                       workload, seed, kernel="none"):
    replicas, prefill, decode = layout
    disaggregated = prefill > 0
    reg = registry.get(strategy)
    cfg = small_config(
        strategy=strategy, block_size=block_size, kv_slots=kv_slots, router=router, replicas=replicas,
        prefill_replicas=prefill, decode_replicas=decode, n=1 if disaggregated else n, preemption=preemption,
        chunked_prefill=chunked_prefill, workload=workload, seed=seed, kernel=kernel, num_requests=NUM_REQUESTS,
        rate=60.0, swap_gib=1 / 4096,
        # a shared tier serves colocated replicas of a prefix cache (docs/fleet.md)
        shared_tier_gib=1 / 1024 if shared_tier and reg.prefix_cache and not disaggregated else 0.0)
    res = cfg.resolve()
    tier = registry.create_shared_tier(cfg, res)  # one for the whole fleet (None without)
    checked = type(checked_strategy(cfg))  # the strategy's class, checking its integrity before every snapshot
    strategies = [registry.create_from_config(cfg, res, tier) for _ in range(cfg.num_engines)]
    for strategy in strategies:
        strategy.__class__ = checked
    result = simulate_fleet(cfg, build_workload(cfg), strategies)
    steps, requests, summary = result.steps, result.requests, result.summary
    assert (steps[list(C.SLOT_COLUMNS)].sum(axis=1) == summary["kv_slots"]).all()
    assert len(requests) == NUM_REQUESTS and requests["request_id"].is_unique
    assert requests["status"].map(lambda s: s == "finished" or s.startswith("rejected: ")).all()
    assert summary["num_finished"] + summary["num_rejected"] == NUM_REQUESTS
    assert requests["num_preemptions"].sum() == steps["preemptions"].sum() == summary["num_preemptions"]
    finished = requests[requests["status"] == "finished"]
    assert (finished["finish_s"] >= finished["first_token_s"]).all()
    assert (finished["first_token_s"] > finished["arrival_s"]).all()
