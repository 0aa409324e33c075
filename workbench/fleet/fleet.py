"""A fleet (docs/fleet.md): N replicas of the single-instance engine behind one router, in one event loop.

Each replica is the engine of `workbench.engine` unchanged (its own strategy, scheduler, kernel runner,
clock and exact accounting). The loop takes the earliest event: an arrival is routed (the router reads
the replicas as they stand) and handed to its replica; otherwise the replica whose next step is
earliest takes it. An arrival at the same instant as a step is routed first, which is what a single
replica does when it takes every request that arrived by the step, so a fleet of one replays the
single-instance run exactly. `workbench.engine.simulation.simulate_fleet` builds the replicas and runs
this loop.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from workbench.allocators.prefix.keys import block_keys
from workbench.allocators.prefix.leading import leading_held
from workbench.config import RunConfig
from workbench.engine.summary_counters import summed_spec_counters
from workbench.fleet.routers import Router
from workbench.results import summarize
from workbench.workload.request import Request, failed_rows_dropped

SUMMED_EXTRA = ("prefix_query_tokens", "prefix_hit_tokens", "prefix_evicted_blocks", "prefix_hit_tokens_host",
                "host_bytes_loaded", "host_bytes_demoted", "prefix_hit_tokens_shared", "shared_bytes_loaded",
                "shared_bytes_demoted", "kernel_time_s")


class Member:
    """One replica as a router sees it (workbench.fleet.routers.ReplicaView). Pure."""

    def __init__(self, replica) -> None:
        """`replica`: a workbench.engine.replica.Replica (its scheduler, strategy, step log)."""
        self.replica = replica
        self.scheduler = replica.scheduler
        self.strategy = replica.scheduler.strategy
        # requests routed here and not yet admitted (`inflight_prompt_tokens`): request index -> prompt
        # block keys, and how many of them hold each key; followed from the first query on
        self._inflight: dict[int, list[int]] = {}
        self._inflight_keys: Counter[int] = Counter()
        self._followed = 0  # requests of the scheduler's list taken into `_inflight` so far

    def outstanding(self) -> int:
        return self.scheduler.outstanding()

    def active_blocks(self) -> int:
        snap = self.strategy.snapshot()
        return (snap.token_slots + snap.reserved_slots + snap.internal_frag_slots) // self.strategy.block_size

    def cached_prompt_tokens(self, token_ids: np.ndarray) -> int:
        return self.strategy.cached_prompt_tokens(token_ids)

    def inflight_prompt_tokens(self, prompt_keys: list[int]) -> int:
        """Leading full blocks of a prompt (its `block_keys`), in tokens, that a request routed here and not
        yet admitted shares with it: its cache will hold them once that request is computed, which the
        replica's first-come-first-served queue does before it computes this one."""
        log, requests = self.scheduler.log, self.scheduler.arrivals.requests
        for index in range(self._followed, len(requests)):
            keys = block_keys(requests[index].prompt_token_ids(), self.strategy.block_size).tolist()
            self._inflight[index] = keys
            self._inflight_keys.update(keys)
        self._followed = len(requests)
        for index in [i for i in self._inflight if not np.isnan(log.admitted_s[i]) or log.status[i] != "pending"]:
            for key in self._inflight.pop(index):
                self._inflight_keys[key] -= 1
                if not self._inflight_keys[key]:
                    del self._inflight_keys[key]  # a key present is held by a request still in flight
        return leading_held(prompt_keys, self._inflight_keys) * self.strategy.block_size

    def queued_prefill_tokens(self) -> int:
        return self.scheduler.queued_prefill_tokens()


def drive(members: list[Member], router: Router, requests: list[Request], progress: bool
           ) -> tuple[np.ndarray, list[float]]:
    """Run the event loop to the end. Returns each request's replica, int64 [num_requests], and the
    max/mean outstanding requests over replicas after each routing."""
    from tqdm import tqdm

    placed = np.full(len(requests), -1, dtype=np.int64)
    imbalance: list[float] = []
    nxt = 0
    # the next request to route, read once (a columns workload builds a `Request` at each read)
    upcoming = requests[0] if len(requests) else None
    # each replica's next event: it changes only when that replica steps or is handed a request
    next_s = [m.replica.next_event_s() for m in members]
    with tqdm(total=len(requests), unit="req", desc="requests", disable=not progress) as bar:
        while True:
            step_at, who = earliest_event(next_s)
            if upcoming is not None and (step_at is None or upcoming.arrival_s <= step_at):
                chosen = router.choose(upcoming, members)
                members[chosen].scheduler.add_request(upcoming)
                next_s[chosen] = members[chosen].replica.next_event_s()
                placed[nxt] = chosen
                imbalance.append(load_imbalance(members))
                nxt += 1
                upcoming = requests[nxt] if nxt < len(requests) else None
            elif step_at is None:
                break
            else:
                bar.update(members[who].replica.step(step_at))
                next_s[who] = members[who].replica.next_event_s()
    return placed, imbalance


def load_imbalance(members: list[Member]) -> float:
    """Pure. The most outstanding requests on one replica over the mean (1: balanced), after a routing."""
    loads = [m.outstanding() for m in members]
    return max(loads) / (sum(loads) / len(loads))


def earliest_event(next_s: list[float | None]) -> tuple[float | None, int]:
    """Pure. The earliest next event and its replica (the lowest index among equals); (None, -1) when no
    replica has one."""
    step_at, who = None, -1
    for k, t in enumerate(next_s):
        if t is not None and (step_at is None or t < step_at):
            step_at, who = t, k
    return step_at, who


def merge(cfg: RunConfig, members: list[Member], requests: list[Request], placed: np.ndarray,
          imbalance: list[float], extras: list[dict[str, Any]], wall_s: float
          ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """The fleet's steps and requests tables (a `replica` column in both) and its summary, from the
    replicas' own tables and `extras` (each replica's summary keys its tables cannot give)."""
    step_table, tables, per_replica = replica_tables(members, extras)
    tables = [table.assign(replica=k) for k, table in enumerate(tables)]
    order = {r.request_id: i for i, r in enumerate(requests)}
    req_table = pd.concat(tables, ignore_index=True)
    req_table = req_table.iloc[np.argsort(req_table["request_id"].map(order).to_numpy(), kind="stable")]
    req_table = req_table.reset_index(drop=True)
    assert np.array_equal(req_table["replica"].to_numpy(), placed), "a request's row is not on its replica"
    extra = {**extras[0], **{key: sum(e.get(key, 0) for e in extras) for key in SUMMED_EXTRA},
             "verify_max_rel_err": max(e["verify_max_rel_err"] for e in extras),
             "sim_wall_s": wall_s, "num_failed_rows_dropped": failed_rows_dropped(requests),
             **summed_spec_counters(extras)}
    extra["kernel_gbps"] = float(np.mean([e["kernel_gbps"] for e in extras]))
    summary = summarize(step_table, req_table, capacity_slots=members[0].strategy.capacity_slots,
                        generated_tokens=sum(m.scheduler.log.generated_tokens for m in members), extra=extra)
    summary.update(fleet_summary(cfg, per_replica, imbalance))
    return step_table, req_table, summary


def replica_tables(members: list[Member], extras: list[dict[str, Any]]
                   ) -> tuple[pd.DataFrame, list[pd.DataFrame], list[dict[str, Any]]]:
    """The fleet's steps table (every replica's steps with its index in `replica`, in time order; a
    replica's own steps keep their order), each replica's own requests table, and each one's summary."""
    steps, tables, per_replica = [], [], []
    for k, (m, extra) in enumerate(zip(members, extras, strict=True)):
        replica_steps = m.replica.steps.to_frame()
        replica_requests = m.scheduler.log.to_frame(m.scheduler.arrivals.requests)
        own = summarize(replica_steps, replica_requests, capacity_slots=m.strategy.capacity_slots,
                        generated_tokens=m.scheduler.log.generated_tokens, extra={**extra, "sim_wall_s": 0.0})
        del own["sim_wall_s"]  # one loop drives every replica: a replica's own wall time is not measured
        per_replica.append(own)
        steps.append(replica_steps.assign(replica=k))
        tables.append(replica_requests)
    step_table = pd.concat(steps, ignore_index=True).sort_values(["t_s", "replica"], kind="stable",
                                                                  ignore_index=True)
    return step_table, tables, per_replica


def fleet_summary(cfg: RunConfig, per_replica: list[dict[str, Any]], imbalance: list[float],
                  kv_transfer_bytes: int = 0) -> dict[str, Any]:
    """The fleet's own keys (columns.FLEET_SUMMARY_KEYS): its size and router, the load imbalance (mean over
    arrivals of max/mean outstanding requests over the replicas the router picks from), the KV bytes shipped
    prefill -> decode (0 for colocated replicas) and every replica's own summary."""
    return {"replicas": len(per_replica), "router": cfg.router,
            "load_imbalance": float(np.mean(imbalance)) if imbalance else 1.0,
            "kv_transfer_bytes": kv_transfer_bytes, "per_replica": per_replica}
