"""Disaggregated prefill/decode (docs/fleet.md): P prefill replicas behind the router, D decode replicas,
and the links between them, in one event loop.

A request's life: the router picks a prefill replica at its arrival; that replica runs it as a request of
one output token (its prompt's prefill makes the first token, then it is done there, its blocks still
held). At that instant the decode replica with the fewest outstanding requests (counting those on their
way to it; ties: the lowest index) is chosen, and the prompt's KV (prompt tokens × the full model's KV
bytes per token) is queued for the links it crosses. When its transfer ends the prefill replica frees the
request's blocks (`Replica.release`) and the request arrives at the decode replica with its KV and first
token (`Scheduler.add_request(transferred=True)`): it queues for blocks like any request, is admitted
without computing anything, and decodes the rest of its output.

Topology (`Links`): every replica is one GPU with one RDMA NIC port of `kv_link_gb_s` GB/s in each direction
into a non-blocking fabric, as in Mooncake's and Splitwise's clusters (a NIC per GPU, GPUDirect RDMA from
device memory to device memory) and vLLM's NIXL connector (one point-to-point read per request). A transfer
p -> d occupies p's sending side and d's receiving side for its whole length: transfers out of one prefill
replica share its sending side, transfers into one decode replica share its receiving side, and each side
serves its transfers one at a time, first come first served.

Events at one instant go in this order: arrivals (routed), prefill completions (decode replica and links),
transfer ends (blocks freed on the prefill side, the request joins its decode replica), then steps, so a
step sees everything that happened by its start, as in the colocated fleet (workbench.fleet.fleet). Ties
among completions or transfer ends go by arrival order. Every replica is the engine of `workbench.engine`,
stepped alone.
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from workbench.clock.roofline import link_s
from workbench.config import RunConfig
from workbench.engine.summary_counters import summed_spec_counters
from workbench.fleet.fleet import SUMMED_EXTRA, Member, earliest_event, fleet_summary, load_imbalance, replica_tables
from workbench.fleet.routers import Router
from workbench.results import summarize
from workbench.workload.request import Request, failed_rows_dropped

PREFILLED, LANDED = 0, 1  # event kinds, in their order at one instant
PREFILL_COUNTED = ("prefix_query_tokens", "prefix_hit_tokens", "prefix_hit_tokens_host", "prefix_hit_tokens_shared")


@dataclass
class Flow:
    """Where each request went and when its KV moved, indexed by the request's position in the trace."""

    num_requests: int
    prefill: np.ndarray = field(init=False)  # int64: its prefill replica
    prefill_row: np.ndarray = field(init=False)  # int64: its row in that replica's request log
    decode: np.ndarray = field(init=False)  # int64: its decode replica (-1: none, it ended on the prefill side)
    decode_row: np.ndarray = field(init=False)  # int64: its row in that replica's log (-1: none)
    transfer_start_s: np.ndarray = field(init=False)  # when its KV started crossing the link (NaN: never)
    kv_arrived_s: np.ndarray = field(init=False)  # when its transfer ended (NaN: never)
    transfer_bytes: np.ndarray = field(init=False)  # int64: bytes it shipped (0: none)
    imbalance: list[float] = field(default_factory=list)  # max/mean outstanding over prefill replicas per arrival

    def __post_init__(self) -> None:
        n = self.num_requests
        self.prefill, self.prefill_row = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        self.decode, self.decode_row = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        self.transfer_start_s, self.kv_arrived_s = np.full(n, np.nan), np.full(n, np.nan)
        self.transfer_bytes = np.zeros(n, np.int64)


class Links:
    """The NIC ports the KV crosses (the topology in the module's docstring): one sending side per prefill
    replica, one receiving side per decode replica, each serving one transfer at a time in the order the
    transfers were queued. Mutates its own times only."""

    def __init__(self, num_prefill: int, num_decode: int, link_gb_s: float) -> None:
        self.link_gb_s = link_gb_s
        self.send_free_s = [0.0] * num_prefill  # when each prefill replica's sending side has sent all it was given
        self.receive_free_s = [0.0] * num_decode  # when each decode replica's receiving side has taken all of its

    def book(self, prefill: int, decode: int, num_bytes: int, ready_s: float) -> tuple[float, float]:
        """Queue `num_bytes` from prefill replica `prefill` to decode replica `decode`, ready at `ready_s`, behind
        every transfer queued before on either side: both sides are held from its start to its end. Returns
        (start, end) in seconds."""
        start = max(ready_s, self.send_free_s[prefill], self.receive_free_s[decode])
        end = start + link_s(num_bytes, self.link_gb_s)
        self.send_free_s[prefill] = self.receive_free_s[decode] = end
        return start, end


class Disaggregated:
    """The event loop. Mutates the replicas it is given and its own Flow."""

    def __init__(self, prefill: list[Member], decode: list[Member], router: Router, requests: list[Request], *,
                 kv_bytes_per_token: int, kv_link_gb_s: float) -> None:
        self.prefill, self.decode, self.router, self.requests = prefill, decode, router, requests
        self.kv_bytes_per_token = kv_bytes_per_token
        self.max_model_len = prefill[0].scheduler.config.max_model_len
        self.flow = Flow(len(requests))
        self.links = Links(len(prefill), len(decode), kv_link_gb_s)
        self.in_flight = [0] * len(decode)  # requests on their way to each decode replica
        self.events: list[tuple[float, int, int]] = []  # (time, kind, request position): a heap
        self.next_arrival = 0
        # per prefill replica: its log rows not yet finished or rejected -> the request's position
        self.open_rows: list[dict[int, int]] = [{} for _ in prefill]
        self.closed: list[int] = [0] * len(prefill)  # finished + rejected rows seen so far per prefill replica
        self.done = 0  # requests that ended (finished or rejected) anywhere

    def members(self) -> list[Member]:
        """Every replica, prefill first: the fleet's replica numbering."""
        return [*self.prefill, *self.decode]

    def run(self, progress: bool = False) -> Flow:
        from tqdm import tqdm

        members = self.members()
        with tqdm(total=len(self.requests), unit="req", desc="requests", disable=not progress) as bar:
            while True:
                # an event (a transfer landing, blocks released) changes replicas: each is asked anew
                step_at, who = earliest_event([m.replica.next_event_s() for m in members])
                event_at = self.events[0][0] if self.events else None
                arrival_at = (self.requests[self.next_arrival].arrival_s
                              if self.next_arrival < len(self.requests) else None)
                before = self.done
                if arrival_at is not None and all(t is None or arrival_at <= t for t in (step_at, event_at)):
                    self._route()
                elif event_at is not None and (step_at is None or event_at <= step_at):
                    self._event()
                elif step_at is not None:
                    self._step(who)
                else:
                    break
                bar.update(self.done - before)
        return self.flow

    # ---- events ------------------------------------------------------------------------------
    def _route(self) -> None:
        """The next arrival goes to the prefill replica the router picks, as a request of one output token
        (whole when it can never fit max_model_len, so that replica rejects it as a colocated one would)."""
        k = self.next_arrival
        self.next_arrival += 1
        request = self.requests[k]
        chosen = self.router.choose(request, self.prefill)
        fits = request.prompt_tokens + request.output_tokens <= self.max_model_len
        sched = self.prefill[chosen].scheduler
        # a prompt that will be shipped keeps its blocks on this replica until its transfer ends
        sched.add_request(dataclasses.replace(request, output_tokens=1) if fits else request,
                          holds_kv=fits and request.output_tokens > 1)
        row = len(sched.arrivals.requests) - 1
        self.flow.prefill[k], self.flow.prefill_row[k] = chosen, row
        self.open_rows[chosen][row] = k
        self.flow.imbalance.append(load_imbalance(self.prefill))

    def _event(self) -> None:
        t, kind, k = heapq.heappop(self.events)
        if kind == PREFILLED:
            self._ship(k, t)
        else:
            self._land(k, t)

    def _ship(self, k: int, t: float) -> None:
        """Request k's prefill ended at t: choose its decode replica now and queue its KV on the links."""
        flow, p = self.flow, int(self.flow.prefill[k])
        d = min(range(len(self.decode)), key=lambda i: (self.decode[i].outstanding() + self.in_flight[i], i))
        num_bytes = self.requests[k].prompt_tokens * self.kv_bytes_per_token
        start, end = self.links.book(p, d, num_bytes, t)
        flow.decode[k], flow.transfer_bytes[k] = d, num_bytes
        flow.transfer_start_s[k], flow.kv_arrived_s[k] = start, end
        self.in_flight[d] += 1
        heapq.heappush(self.events, (end, LANDED, k))

    def _land(self, k: int, t: float) -> None:
        """Request k's KV is at its decode replica: its prefill replica frees its blocks, and it arrives at the
        decode replica now, its prompt computed."""
        self.prefill[int(self.flow.prefill[k])].replica.release(int(self.flow.prefill_row[k]), t)
        d = int(self.flow.decode[k])
        sched = self.decode[d].scheduler
        sched.add_request(dataclasses.replace(self.requests[k], arrival_s=t), transferred=True)
        self.flow.decode_row[k] = len(sched.arrivals.requests) - 1
        self.in_flight[d] -= 1

    def _step(self, who: int) -> None:
        if who >= len(self.prefill):  # a decode replica ends requests by finishing or rejecting them
            log = self.decode[who - len(self.prefill)].scheduler.log
            rejected = log.num_rejected
            self.done += self.decode[who - len(self.prefill)].replica.step() + log.num_rejected - rejected
            return
        member = self.prefill[who]
        member.replica.step()
        log = member.scheduler.log
        if log.num_finished + log.num_rejected == self.closed[who]:
            return
        self.closed[who] = log.num_finished + log.num_rejected
        open_rows = self.open_rows[who]
        for row in sorted(r for r in open_rows if log.status[r] != "pending"):
            k = open_rows.pop(row)
            if log.status[row] == "finished" and self.requests[k].output_tokens > 1:
                heapq.heappush(self.events, (float(log.finish_s[row]), PREFILLED, k))
            else:  # rejected, or its one output token was its whole answer
                self.done += 1


# ---- outputs ---------------------------------------------------------------------------------
def merge(cfg: RunConfig, prefill: list[Member], decode: list[Member], requests: list[Request], flow: Flow,
          extras: list[dict[str, Any]], wall_s: float) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """The fleet's steps table (replica: prefill replicas 0..P-1, decode replicas P..P+D-1), its requests
    table (one row per request, end to end) and its summary (`kv_transfer_bytes` added)."""
    members = [*prefill, *decode]
    step_table, logs, per_replica = replica_tables(members, extras)
    req_table = requests_table(requests, flow, logs[:len(prefill)], logs[len(prefill):])
    finished = req_table["status"] == "finished"
    # a prompt's prefix hit saves compute on its prefill replica: the fleet's lookups and hits are the prefill
    # replicas' (a decode replica's own, at admissions and recomputes, stay in its per-replica summary)
    looked_up = extras[:len(prefill)]
    extra = {**extras[0], **{key: sum(e.get(key, 0) for e in extras) for key in SUMMED_EXTRA},
             **{key: sum(e.get(key, 0) for e in looked_up) for key in PREFILL_COUNTED},
             "verify_max_rel_err": max(e["verify_max_rel_err"] for e in extras), "sim_wall_s": wall_s,
             "num_failed_rows_dropped": failed_rows_dropped(requests),
             "kernel_gbps": float(np.mean([e["kernel_gbps"] for e in extras])),
             **summed_spec_counters(extras)}
    # every finished request's tokens once (one sequence each): the prefill side's first token is part of it
    generated = int(req_table.loc[finished, "output_tokens"].sum())
    summary = summarize(step_table, req_table, capacity_slots=members[0].strategy.capacity_slots,
                        generated_tokens=generated, extra=extra)
    summary.update(fleet_summary(cfg, per_replica, flow.imbalance, kv_transfer_bytes=int(flow.transfer_bytes.sum())))
    return step_table, req_table, summary


def requests_table(requests: list[Request], flow: Flow, prefill_logs: list[pd.DataFrame],
                   decode_logs: list[pd.DataFrame]) -> pd.DataFrame:
    """One row per request in the trace's order: arrival, admission and prefix hits from its prefill
    replica; first token (the decode replica's admission of its KV), finish and status from its decode
    replica when it reached one, else from its prefill replica; preemptions summed over both."""
    pre = _rows(prefill_logs, flow.prefill, flow.prefill_row)
    reached = flow.decode >= 0
    dec = _rows(decode_logs, np.where(reached, flow.decode, 0), np.where(reached, flow.decode_row, 0)) \
        if decode_logs and any(len(f) for f in decode_logs) else None
    table = pd.DataFrame({
        "request_id": [r.request_id for r in requests],
        "arrival_s": [r.arrival_s for r in requests],
        "admitted_s": pre["admitted_s"].to_numpy(),
        "first_token_s": _either(reached, dec, pre, "first_token_s"),
        "finish_s": _either(reached, dec, pre, "finish_s"),
        "prompt_tokens": [r.prompt_tokens for r in requests],
        "output_tokens": [r.output_tokens for r in requests],
        "prefix_hit_tokens": pre["prefix_hit_tokens"].to_numpy(),
        "num_preemptions": pre["num_preemptions"].to_numpy() + _or_zero(reached, dec, "num_preemptions"),
        "status": _either(reached, dec, pre, "status"),
    })
    num_prefill = len(prefill_logs)
    return table.assign(replica=np.where(reached, num_prefill + flow.decode, flow.prefill),
                        prefill_replica=flow.prefill, prefill_finish_s=pre["finish_s"].to_numpy(),
                        kv_arrived_s=flow.kv_arrived_s)


def _rows(logs: list[pd.DataFrame], owner: np.ndarray, row: np.ndarray) -> pd.DataFrame:
    """Row `row[k]` of log `owner[k]` for every k."""
    offsets = np.concatenate([[0], np.cumsum([len(f) for f in logs])])
    return pd.concat(logs, ignore_index=True).iloc[offsets[owner] + row].reset_index(drop=True)


def _either(reached: np.ndarray, dec: pd.DataFrame | None, pre: pd.DataFrame, column: str) -> np.ndarray:
    if dec is None:
        return pre[column].to_numpy()
    return np.where(reached, dec[column].to_numpy(), pre[column].to_numpy())


def _or_zero(reached: np.ndarray, dec: pd.DataFrame | None, column: str) -> np.ndarray:
    return np.zeros(len(reached), np.int64) if dec is None else np.where(reached, dec[column].to_numpy(), 0)
