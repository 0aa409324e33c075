"""A fleet of one replays the single-instance run byte for byte (the golden outputs, every strategy, every
router); a fleet of several keeps every request on exactly one replica, verifies every replica's kernels
and sums its replicas' counters."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.engine.conftest import checked_strategy, replace, small_config
from tests.engine.golden import WORKLOADS, exact_part, load, numerics_problems, outputs_of
from workbench.allocators import registry
from workbench.allocators.prefix.keys import block_keys
from workbench.columns import FLEET_SUMMARY_KEYS
from workbench.config import ROUTER_NAMES
from workbench.engine import RunResult
from workbench.engine.simulation import simulate_fleet
from workbench.fleet import fleet as fleet_loop
from workbench.fleet.fleet import earliest_event, load_imbalance
from workbench.workload import build_workload

GOLDEN = load()
FLEET_KEYS = FLEET_SUMMARY_KEYS


def as_single(result: RunResult) -> RunResult:
    """A fleet's result without what only a fleet has: the replica column and the fleet's summary keys."""
    summary = {k: v for k, v in result.summary.items() if k not in FLEET_KEYS}
    return RunResult(result.steps.drop(columns="replica"), result.requests.drop(columns="replica"), summary)


def fleet_of(cfg, replicas: int) -> tuple[RunResult, list]:
    strategies = [checked_strategy(cfg) for _ in range(replicas)]
    result = simulate_fleet(cfg, build_workload(cfg), strategies)
    for s in strategies:
        s.check_integrity()
    return result, strategies


# Quick: a contiguous and a paged prefix-caching strategy on the workload that preempts by swapping (the
# fleet loop knows no strategy; every strategy runs in a fleet below); the full run adds every golden case
QUICK = {("contiguous-max", "chat-swap"), ("paged-prefix", "chat-swap")}


def _cases():
    return [pytest.param(s, w, id=f"{s}-{w}", marks=() if (s, w) in QUICK else pytest.mark.slow)
            for s in sorted(GOLDEN) for w in sorted(WORKLOADS) if w in GOLDEN[s]]


@pytest.mark.parametrize(("strategy", "workload"), _cases())
def test_a_fleet_of_one_reproduces_the_golden_outputs(strategy, workload):
    cfg = small_config(strategy=strategy, **WORKLOADS[workload])
    got = outputs_of(as_single(fleet_of(cfg, 1)[0]))
    assert exact_part(got) == exact_part(GOLDEN[strategy][workload])
    assert not numerics_problems(got)


@pytest.mark.parametrize("router", ROUTER_NAMES)
def test_every_router_in_a_fleet_of_one_is_the_single_instance(router):
    cfg = small_config(strategy="paged-prefix", router=router, kernel="none",
                       workload="multi-turn", num_requests=40)
    single = outputs_of(as_single(fleet_of(replace(cfg, router="round-robin"), 1)[0]))
    assert outputs_of(as_single(fleet_of(cfg, 1)[0])) == single


# every strategy behind one router, the routers taken in turn (so each serves several strategies)
@pytest.mark.parametrize(("strategy", "router"), [(s, ROUTER_NAMES[i % len(ROUTER_NAMES)])
                                                  for i, s in enumerate(registry.names())])
def test_every_request_is_served_by_exactly_one_replica(strategy, router):
    cfg = small_config(strategy=strategy, router=router, kernel="none", workload="multi-turn", num_requests=30,
                       rate=80.0)
    result, strategies = fleet_of(cfg, 3)
    requests, summary = result.requests, result.summary
    assert requests["request_id"].tolist() == [r.request_id for r in build_workload(cfg)]
    assert set(requests["replica"]) <= {0, 1, 2} and requests["replica"].notna().all()
    assert (requests["status"] == "finished").all()
    per = summary["per_replica"]
    assert [p["num_requests"] for p in per] == np.bincount(requests["replica"], minlength=3).tolist()
    for key in ("prefix_query_tokens", "prefix_hit_tokens", "prefix_evicted_blocks"):
        assert summary[key] == sum(p[key] for p in per)
    assert summary["prefix_hit_tokens"] == requests["prefix_hit_tokens"].sum()
    for k in range(3):  # each replica's steps are its own engine's: one clock, steps numbered from 0
        mine = result.steps[result.steps["replica"] == k]
        assert mine["step"].tolist() == list(range(len(mine)))
        assert np.all(np.diff(mine["t_s"].to_numpy()) > 0)
    assert summary["load_imbalance"] >= 1.0
    # one loop drives every replica: the fleet's wall time is measured, a replica's own is not
    assert summary["sim_wall_s"] > 0 and all("sim_wall_s" not in p for p in per)
    json.dumps(summary)  # summary.json can hold it


def test_every_replica_verifies_its_kernels():
    cfg = small_config(strategy="paged-prefix", router="least-loaded", workload="multi-turn", num_requests=20)
    result, _ = fleet_of(cfg, 2)
    per = result.summary["per_replica"]
    assert all(p["num_requests"] > 0 for p in per)
    assert not numerics_problems(outputs_of(result))
    assert result.summary["verify_max_rel_err"] == max(p["verify_max_rel_err"] for p in per)


def test_a_member_reports_what_a_router_reads():
    from workbench.engine.simulation import make_replica
    from workbench.fleet.fleet import Member

    cfg = small_config(strategy="paged-prefix", kernel="none", workload="system-prompt:k=1,system=64",
                       num_requests=3, rate=1e6)
    member = Member(make_replica(cfg, cfg.resolve(), registry.create_from_config(cfg, cfg.resolve()), [], "none"))
    requests = build_workload(cfg)
    for r in requests:
        member.scheduler.add_request(r)
    assert member.outstanding() == 3 and member.active_blocks() == 0
    assert member.queued_prefill_tokens() == sum(r.prompt_tokens for r in requests)  # routed, not yet arrived
    assert member.cached_prompt_tokens(requests[0].prompt_token_ids()) == 0
    system_blocks_tokens = 64 // cfg.block_size * cfg.block_size  # the shared system prompt's full blocks
    while member.scheduler.log.num_finished < 3:
        not_admitted = np.isnan(member.scheduler.log.admitted_s[:3])  # no preemption, no chunks in this run
        assert member.queued_prefill_tokens() == sum(r.prompt_tokens for r, wait in zip(requests, not_admitted,
                                                                                         strict=True) if wait)
        # a request routed here and not admitted shares the system prompt with the first one
        inflight = member.inflight_prompt_tokens(block_keys(requests[0].prompt_token_ids(), cfg.block_size).tolist())
        assert inflight >= system_blocks_tokens if not_admitted.any() else inflight == 0
        member.replica.step()
    assert member.outstanding() == 0 and member.active_blocks() == 0
    # the shared system prompt stays cached
    assert member.cached_prompt_tokens(requests[0].prompt_token_ids()) >= 64 - cfg.block_size


def _ask_every_replica(members, router, requests, progress):
    """`fleet.drive` as its rule reads, without keeping next events: every replica is asked at every event."""
    del progress
    placed, imbalance, nxt = np.full(len(requests), -1, dtype=np.int64), [], 0
    while True:
        step_at, who = earliest_event([m.replica.next_event_s() for m in members])
        if nxt < len(requests) and (step_at is None or requests[nxt].arrival_s <= step_at):
            chosen = router.choose(requests[nxt], members)
            members[chosen].scheduler.add_request(requests[nxt])
            placed[nxt] = chosen
            imbalance.append(load_imbalance(members))
            nxt += 1
        elif step_at is None:
            return placed, imbalance
        else:
            members[who].replica.step(step_at)


@pytest.mark.parametrize("router", ROUTER_NAMES)
def test_the_loop_keeps_each_replicas_next_event_as_asking_every_replica_would(router, monkeypatch):
    cfg = small_config(strategy="paged-prefix", router=router, kernel="none", workload="multi-turn",
                       num_requests=60, rate=120.0)
    kept = outputs_of(fleet_of(cfg, 3)[0])
    monkeypatch.setattr(fleet_loop, "drive", _ask_every_replica)
    assert outputs_of(fleet_of(cfg, 3)[0]) == kept


def test_the_earliest_event_skips_idle_replicas_and_breaks_ties_by_index():
    assert earliest_event([None, 2.0, 1.5, 1.5]) == (1.5, 2)
    assert earliest_event([0.0, 0.0]) == (0.0, 0)
    assert earliest_event([None, None]) == (None, -1)
    assert earliest_event([]) == (None, -1)
