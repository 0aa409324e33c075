"""Disaggregated prefill/decode (`--prefill-replicas`, `--decode-replicas`, `--kv-link-gb-s`): a case of one
prefill and one decode replica worked by hand (bytes, link time, decode admission, TTFT), a decode replica
without free blocks, link FIFO, preemption on the decode side (recompute and swap), a kernel-verified run
of every strategy, the configuration's one-line refusals, and random walks with invariants after every event."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tests.engine.conftest import SMALL_MODEL, checked_strategy, small_config
from tests.engine.golden import numerics_problems, outputs_of
from workbench.allocators import registry
from workbench.clock.profiles import make_clock
from workbench.columns import DISAGGREGATED_REQUEST_COLUMNS, FLEET_SUMMARY_KEYS, REQUEST_COLUMNS
from workbench.config import RunConfig
from workbench.engine.runner import tolerance
from workbench.engine.simulation import simulate_disaggregated
from workbench.fleet import disaggregated
from workbench.workload import build_workload
from workbench.workload.request import Request, Segment

BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4  # K and V × 2 layers × 2 KV heads × head_dim 16 × fp32: 512
LINK_GB_S = 0.0512  # 51.2 MB/s: 100 prompt tokens (51 200 bytes) cross in 1 ms


def hand_config(**overrides) -> RunConfig:
    base = dict(model=SMALL_MODEL, kv_slots=2048, kernel="none", kv_dtype="fp32", block_size=16, seed=0,
                prefill_replicas=1, decode_replicas=1, kv_link_gb_s=LINK_GB_S, watermark_frac=0.0)
    base.update(overrides)
    return RunConfig(**base)


def request(rid: int, arrival_s: float, prompt: int, output: int) -> Request:
    return Request(rid, arrival_s, prompt, output, (Segment(1000 + rid, prompt),))


def run_pd(cfg: RunConfig, requests: list[Request]):
    strategies = [checked_strategy(cfg) for _ in range(cfg.num_engines)]
    result = simulate_disaggregated(cfg, requests, strategies)
    for s in strategies:
        s.check_integrity()
    return result


def by_replica(steps, replica: int):
    return steps[steps["replica"] == replica].reset_index(drop=True)


def test_one_prefill_and_one_decode_replica_worked_by_hand():
    """Two prompts (100 and 60 tokens) arrive at 0 and are prefilled in one step of length dt0. Their KV
    crosses the prefill replica's one link one after the other: 100 × 512 = 51 200 bytes in 1 ms, then
    30 720 bytes in 0.6 ms. The idle decode replica admits the first at the instant its KV lands (TTFT =
    dt0 + 1 ms), in a step that computes nothing (weights read + overhead: e); the second lands during that
    step and is admitted when it ends (TTFT = dt0 + 1 ms + e)."""
    cfg = hand_config()
    res = cfg.resolve()
    assert res.kv_bytes_per_token == BYTES_PER_TOKEN
    result = run_pd(cfg, [request(0, 0.0, 100, 3), request(1, 0.0, 60, 3)])
    clock = make_clock(cfg, res, cfg.block_size, paged_kernel=True)
    # the prefill step: 160 tokens through the model, 160 KV rows read, 5050 + 1830 keys attended, and both
    # prompts end, so two rows sample
    dt0 = clock.step_s(160, 160, 100 * 101 // 2 + 60 * 61 // 2, 0, 0, None, 0, 0, sampled_tokens=2)
    link0, link1 = 51_200 / (LINK_GB_S * 1e9), 30_720 / (LINK_GB_S * 1e9)
    assert link0 == 0.001 and link1 == pytest.approx(0.0006, rel=1e-15)
    landed0 = (0.0 + dt0) + link0
    landed1 = landed0 + link1  # FIFO: the second transfer starts when the first ends
    empty_step = clock.step_s(0, 0, 0, 0, 0, None, 0, 0)  # the admission step: nothing computes
    assert empty_step > link1  # the second lands while the decode replica's admission step runs

    req = result.requests
    assert list(req.columns) == [*REQUEST_COLUMNS, "replica", *DISAGGREGATED_REQUEST_COLUMNS]
    assert req["prefill_replica"].tolist() == [0, 0] and req["replica"].tolist() == [1, 1]
    assert req["prefill_finish_s"].tolist() == [dt0, dt0]
    assert req["kv_arrived_s"].tolist() == [landed0, landed1]
    assert req["first_token_s"].tolist() == [landed0, landed0 + empty_step]
    ttft = (req["first_token_s"] - req["arrival_s"]).tolist()
    assert ttft == [landed0, landed0 + empty_step]  # arrival 0: prefill + link queue + transfer + admission wait
    assert req["admitted_s"].tolist() == [0.0, 0.0]  # on the prefill replica
    assert (req["status"] == "finished").all() and req["num_preemptions"].tolist() == [0, 0]
    assert result.summary["kv_transfer_bytes"] == 51_200 + 30_720
    assert result.summary["replicas"] == 2 and result.summary["num_finished"] == 2
    assert result.summary["ttft_p50_s"] == pytest.approx(np.median(ttft), rel=1e-12)

    prefill, decode = by_replica(result.steps, 0), by_replica(result.steps, 1)
    assert prefill["num_prefill_tokens"].tolist() == [160] and prefill["dt_s"].tolist() == [dt0]
    assert (prefill["num_decode_tokens"] == 0).all()
    assert (decode["num_prefill_tokens"] == 0).all()  # no prefill compute for shipped prompts
    assert decode["t_s"].iloc[0] == landed0 + empty_step and decode["dt_s"].iloc[0] == empty_step
    assert decode["token_slots"].iloc[0] == 100  # the first prompt's rows are in the decode pool
    # each request decodes its output - 1 = 2 remaining tokens on the decode replica
    assert decode["num_decode_tokens"].sum() == 2 + 2
    per = result.summary["per_replica"]
    assert per[0]["num_requests"] == per[1]["num_requests"] == 2


@pytest.mark.parametrize(("prefill", "decode", "arrived_ms"), [
    (2, 1, [1.0, 2.0]),  # two prefill replicas into one decode replica: its receiving side is shared
    (1, 2, [1.0, 2.0]),  # one prefill replica to two decode replicas: its sending side is shared
    (2, 2, [1.0, 1.0]),  # 0 -> 2 and 1 -> 3: no side in common, the two cross at once
])
def test_transfers_sharing_a_nic_port_go_one_after_the_other(prefill, decode, arrived_ms):
    """Two prompts of 100 tokens (1 ms each on the link) arrive at 0 and are prefilled by one step each, ending
    at the same instant (round robin over the prefill replicas; the decode replica with the fewest outstanding
    requests, counting those on their way, then the lowest index). Each replica has one NIC port, one transfer
    at a time each way: transfers that share the sending or the receiving side go first come first served (the
    first arrived first), the others overlap."""
    cfg = hand_config(prefill_replicas=prefill, decode_replicas=decode, router="round-robin")
    req = run_pd(cfg, [request(0, 0.0, 100, 3), request(1, 0.0, 100, 3)]).requests
    assert req["prefill_replica"].tolist() == [0, 1 % prefill]
    assert req["replica"].tolist() == [prefill, prefill + 1 % decode]
    finish = req["prefill_finish_s"].tolist()
    assert finish[0] == finish[1]
    assert req["kv_arrived_s"].tolist() == [finish[0] + ms * 1e-3 for ms in arrived_ms]


def test_links_book_both_sides_in_the_order_transfers_are_queued():
    """Three transfers of 1 s each (10^9 bytes over 1 GB/s): 0 -> 0 ready at 0, 1 -> 0 ready at 0.5 waits for
    decode 0's receiving side (1 .. 2), and 0 -> 1 ready at 0.5 waits for prefill 0's sending side (1 .. 2)
    although decode 1 is idle: first come first served on each side, a later transfer never overtakes."""
    links = disaggregated.Links(2, 2, 1.0)
    assert links.book(0, 0, 10**9, 0.0) == (0.0, 1.0)
    assert links.book(1, 0, 10**9, 0.5) == (1.0, 2.0)
    assert links.book(0, 1, 10**9, 0.5) == (1.0, 2.0)
    assert links.book(1, 1, 10**9, 2.5) == (2.5, 3.5)  # both sides idle by then


def test_the_prefill_replica_holds_the_blocks_until_the_kv_has_crossed():
    """10 blocks of 16 slots on every replica, a link of 10 MB/s (100 prompt tokens: 5.12 ms). A (100 tokens:
    7 blocks) arrives at 0 and is prefilled in [0, dt0]; its transfer runs [dt0, dt0 + 5.12 ms], and its 7 blocks
    stay allocated on the prefill replica until then. B (48 tokens: 3 blocks) and C (60 tokens: 4 blocks)
    arrive at dt0: B fits beside A's held blocks (7 + 3 = 10) and is prefilled in [dt0, dt0 + dt1], C does not
    (7 + 3 + 4 > 10) and waits though nothing runs. At dt0 + 5.12 ms A's KV has crossed, A's blocks come free,
    and C is admitted at that instant, beside B's blocks, held while B's transfer waits behind A's (the
    prefill replica's sending side: 2.4576 ms from dt0 + 5.12 ms)."""
    link_gb_s = 0.01
    cfg = hand_config(kv_slots=160, max_model_len=160, kv_link_gb_s=link_gb_s)
    res = cfg.resolve()
    clock = make_clock(cfg, res, cfg.block_size, paged_kernel=True)
    dt0 = clock.step_s(100, 100, 100 * 101 // 2, 0, 0, None, 0, 0, sampled_tokens=1)
    dt1 = clock.step_s(48, 48, 48 * 49 // 2, 0, 0, None, 0, 0, sampled_tokens=1)
    dt2 = clock.step_s(60, 60, 60 * 61 // 2, 0, 0, None, 0, 0, sampled_tokens=1)
    link_a, link_b = 100 * BYTES_PER_TOKEN / (link_gb_s * 1e9), 48 * BYTES_PER_TOKEN / (link_gb_s * 1e9)
    assert link_a == pytest.approx(0.00512, rel=1e-15) and dt1 < link_a  # B's prefill ends while A's KV crosses
    result = run_pd(cfg, [request(0, 0.0, 100, 3), request(1, dt0, 48, 3), request(2, dt0, 60, 3)])
    req = result.requests
    arrived_a = dt0 + link_a
    assert req["prefill_finish_s"].tolist() == [dt0, dt0 + dt1, arrived_a + dt2]
    assert req["kv_arrived_s"].tolist()[:2] == [arrived_a, arrived_a + link_b]  # B's behind A's on one link
    assert req["admitted_s"].tolist() == [0.0, dt0, arrived_a]  # C: the instant A's blocks came free

    prefill = by_replica(result.steps, 0)
    assert prefill["num_prefill_tokens"].tolist() == [100, 48, 60]
    assert prefill["t_s"].tolist() == [dt0, dt0 + dt1, arrived_a + dt2]  # each ends dt_s after its start:
    assert prefill["dt_s"].tolist() == [dt0, dt1, dt2]  # at 0, dt0 and the instant A's KV has crossed
    # during B's prefill (before A's KV has crossed) A's 100 rows still hold 7 blocks: the pool is full;
    # in C's (after) they are free, and B's 48 rows are held while B's KV waits for the link
    assert prefill["token_slots"].tolist() == [100, 100 + 48, 48 + 60]
    assert prefill["free_slots"].tolist() == [160 - 112, 0, 160 - 48 - 64]
    parts = ["token_slots", "reserved_slots", "internal_frag_slots", "cached_slots", "external_frag_slots",
             "free_slots"]
    assert (prefill[parts].sum(axis=1) == 160).all()  # the six-way accounting, held blocks included
    assert (req["status"] == "finished").all()


def test_a_decode_replica_without_free_blocks_makes_the_shipped_request_wait():
    """10 blocks of 16 slots. The first request (100 + 40 tokens) holds 7 blocks on landing and 9 at the end;
    the second (60 prompt tokens: 4 blocks) lands long before and waits in the decode queue until the first
    finishes and frees its blocks; it is admitted at the start of the next step, the instant the first ends."""
    cfg = hand_config(kv_slots=160, max_model_len=160)
    result = run_pd(cfg, [request(0, 0.0, 100, 40), request(1, 0.0, 60, 3)])
    req = result.requests
    assert (req["status"] == "finished").all()
    assert req["kv_arrived_s"][1] < req["finish_s"][0]
    assert req["first_token_s"][1] == req["finish_s"][0]  # admitted when the first request's blocks came free
    decode = by_replica(result.steps, 1)
    start_s = decode["t_s"] - decode["dt_s"]  # t_s is when a step ends
    waiting = decode[(start_s >= req["kv_arrived_s"][1]) & (decode["t_s"] <= req["finish_s"][0])]
    assert len(waiting) > 30 and (waiting["num_waiting"] == 1).all()
    assert decode["preemptions"].sum() == 0
    # the prefill replica could not hold both prompts either: the second was prefilled a step later
    prefill = by_replica(result.steps, 0)
    assert prefill["num_prefill_tokens"].tolist() == [100, 60]


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_decode_side_preemption_completes_every_request(preemption):
    """Two prompts of 50 tokens (4 blocks each) land on a decode replica of 10 blocks; each grows to 109
    tokens (7 blocks), so the later one is preempted. Recompute: the decode replica prefills its prompt and
    generated tokens itself; swap: its blocks go to the host pool and come back. The kernels verify the KV of
    every step against the reference recomputed from the logical tokens."""
    cfg = hand_config(kv_slots=160, max_model_len=160, kernel="numba", verify_every=1, preemption=preemption,
                      swap_gib=0.001)
    result = run_pd(cfg, [request(0, 0.0, 50, 60), request(1, 0.0, 50, 60)])
    req, steps = result.requests, result.steps
    assert (req["status"] == "finished").all() and req["num_preemptions"].tolist() == [0, 1]
    assert result.summary["verify_max_rel_err"] <= tolerance("fp32")
    decode = by_replica(steps, 1)
    assert decode["preemptions"].sum() == 1
    if preemption == "recompute":  # one prefill on the decode replica: the prompt and what it had generated
        recomputed = decode[decode["num_prefill_tokens"] > 0]["num_prefill_tokens"].tolist()
        assert len(recomputed) == 1 and 50 < recomputed[0] < 109
        assert decode["swapped_blocks"].sum() == 0
    else:
        assert (decode["num_prefill_tokens"] == 0).all() and decode["swapped_blocks"].sum() > 0
    assert result.summary["per_replica"][1]["num_preemptions"] == 1
    assert (by_replica(steps, 0)["num_decode_tokens"] == 0).all()


def _verified_case(name: str) -> dict:
    reg = registry.get(name)
    workload = dict(workload="multi-turn", num_requests=16) if reg.prefix_cache else dict(num_requests=16)
    return dict(strategy=name, prefill_replicas=2, decode_replicas=1, router="least-loaded", rate=80.0, **workload)


@pytest.mark.parametrize("name", registry.names())
def test_every_strategy_passes_kernel_verification_disaggregated(name):
    cfg = small_config(**_verified_case(name))
    result = run_pd(cfg, build_workload(cfg))
    summary = result.summary
    assert summary["num_finished"] == 16 and summary["verify_max_rel_err"] <= tolerance("fp32")
    assert not numerics_problems(outputs_of(result))
    assert summary["kv_transfer_bytes"] == int((result.requests["prompt_tokens"]
                                                * cfg.resolve().kv_bytes_per_token).sum())
    per = summary["per_replica"]
    # the fleet's prefix hits are the prefill replicas', request by request
    assert summary["prefix_hit_tokens"] == result.requests["prefix_hit_tokens"].sum() == \
        per[0]["prefix_hit_tokens"] + per[1]["prefix_hit_tokens"]
    assert summary["prefix_query_tokens"] == per[0]["prefix_query_tokens"] + per[1]["prefix_query_tokens"]
    if registry.get(name).prefix_cache:  # the decode replica's own cache held part of some shipped prompts
        assert per[2]["prefix_hit_tokens"] > 0
    json.dumps(summary)


def test_same_config_and_seed_give_identical_results():
    cfg = small_config(**_verified_case("paged-prefix"), kernel="none")
    first, second = (outputs_of(run_pd(cfg, build_workload(cfg))) for _ in range(2))
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)  # NaN figures as text


@pytest.mark.parametrize(("changes", "message"), [
    ({"prefill_replicas": 2}, r"prefill_replicas \(2\) and decode_replicas \(0\) go together"),
    ({"decode_replicas": 1}, r"prefill_replicas \(0\) and decode_replicas \(1\) go together"),
    ({"prefill_replicas": 1, "decode_replicas": 2, "replicas": 2},
     r"replicas \(2\) contradicts prefill_replicas \+ decode_replicas \(1 \+ 2\): leave replicas at 1 or set it to 3"),
    ({"prefill_replicas": 1, "decode_replicas": 1, "n": 2}, "n > 1 and beam_width > 1 are not built"),
    ({"prefill_replicas": 1, "decode_replicas": 1, "beam_width": 2}, "n > 1 and beam_width > 1 are not built"),
    ({"prefill_replicas": 1, "decode_replicas": 1, "strategy": "paged-prefix", "shared_tier_gib": 1.0},
     "shared_tier_gib with prefill_replicas/decode_replicas is not built"),
    ({"prefill_replicas": -1, "decode_replicas": 1}, "prefill_replicas must be >= 0"),
    ({"prefill_replicas": 1, "decode_replicas": 1, "kv_link_gb_s": 0.0}, "kv_link_gb_s must be >= 0.01"),
])
def test_bad_combinations_are_refused_in_one_line(changes, message):
    with pytest.raises(ValueError, match=message) as err:
        RunConfig(**changes).resolve()
    assert "\n" not in str(err.value)


def test_the_cli_refuses_in_one_line_and_takes_the_flags(capsys):
    from workbench.run import build_parser, main

    assert main(["--prefill-replicas", "1", "--kernel", "none"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "decode_replicas (0) go together" in err
    args = build_parser().parse_args(["--prefill-replicas", "1", "--decode-replicas", "3", "--kv-link-gb-s", "50"])
    assert (args.prefill_replicas, args.decode_replicas, args.kv_link_gb_s) == (1, 3, 50.0)
    cfg = RunConfig(prefill_replicas=1, decode_replicas=3, replicas=4)  # replicas may name the total
    assert cfg.num_engines == 4 and RunConfig(prefill_replicas=1, decode_replicas=3).num_engines == 4


def test_a_sweep_takes_the_pools_and_the_link_as_axes():
    from workbench.sweep import parse_spec

    spec = parse_spec({"base": {"kernel": "none"},  # each axis value is checked alone, the pairing per point
                       "axes": {"prefill_replicas": [1, 2], "decode_replicas": [2], "kv_link_gb_s": [12.5, 25]}})
    assert sorted((p.config.prefill_replicas, p.config.kv_link_gb_s) for p in spec.points()) == \
        [(1, 12.5), (1, 25.0), (2, 12.5), (2, 25.0)]


def test_a_colocated_fleet_ships_nothing():
    from workbench.engine.simulation import run

    cfg = small_config(kernel="none", replicas=2, num_requests=8)
    summary = run(cfg)
    assert summary["kv_transfer_bytes"] == 0 and set(FLEET_SUMMARY_KEYS) <= set(summary)
    assert "kv_transfer_bytes" not in run(dataclasses.replace(cfg, replicas=1))


def test_the_run_writes_one_row_per_request(tmp_path):
    import pandas as pd

    from workbench.engine.simulation import run

    cfg = small_config(kernel="none", prefill_replicas=1, decode_replicas=2, num_requests=12)
    summary = run(cfg, tmp_path / "pd")
    requests = pd.read_parquet(tmp_path / "pd" / "requests.parquet")
    steps = pd.read_parquet(tmp_path / "pd" / "steps.parquet")
    assert len(requests) == 12 and requests["request_id"].is_unique
    assert set(steps["replica"]) <= {0, 1, 2} and summary["kv_transfer_bytes"] > 0
    assert json.loads((tmp_path / "pd" / "summary.json").read_text())["kv_transfer_bytes"] == \
        summary["kv_transfer_bytes"]


class Checked(disaggregated.Disaggregated):
    """The event loop with its invariants checked after every event."""

    def _route(self) -> None:
        super()._route()
        self.check()

    def _event(self) -> None:
        super()._event()
        self.check()

    def _step(self, who: int) -> None:
        super()._step(who)
        self.check()

    def check(self) -> None:
        flow = self.flow
        for m in self.prefill:  # prefill replicas never decode: nothing ever joins their decode batch
            assert not m.scheduler.batch and not m.scheduler.device.swapped
        landing = [k for _, kind, k in self.events if kind == disaggregated.LANDED]
        # a prefill replica holds the blocks of exactly the requests it finished whose KV has not crossed yet
        pending = [k for _, _, k in self.events]
        for p, m in enumerate(self.prefill):
            assert set(m.scheduler.device.held) == {int(flow.prefill_row[k]) for k in pending if flow.prefill[k] == p}
            assert m.scheduler.device.held_seqs == len(m.scheduler.device.held)
        assert self.in_flight == np.bincount(flow.decode[landing], minlength=len(self.decode)).tolist()
        reached = flow.decode_row >= 0
        assert (flow.decode[reached] >= 0).all()
        for d, m in enumerate(self.decode):  # every shipped request arrived once, at the replica chosen for it
            assert len(m.scheduler.arrivals.requests) == int(np.sum(flow.decode[reached] == d))
        shipped = flow.decode >= 0
        assert flow.transfer_bytes.sum() == sum(self.requests[k].prompt_tokens
                                                for k in np.flatnonzero(shipped)) * self.kv_bytes_per_token
        assert self.done <= len(self.requests)


def _no_prefill_but_recompute(member):
    """Wrap a decode replica's scheduler: every prefill it plans recomputes a preempted request."""
    sched = member.scheduler
    schedule = sched.schedule

    def checked(now_s):
        plan = schedule(now_s)
        for p in plan.prefills:
            assert sched.log.num_preemptions[p.request_index] > 0, "a decode replica prefilled a new prompt"
        assert not plan.landed or all(sched.log.num_preemptions[t.request_index] == 0 for t in plan.landed)
        return plan

    sched.schedule = checked


WALK_STRATEGIES = ("paged", "paged-prefix", "contiguous-max", "radix", "paged", "virtual-contiguous")


@pytest.mark.parametrize("seed", range(len(WALK_STRATEGIES)))
def test_random_walks_keep_the_invariants(seed):
    """Small pools under a high rate, so that decode replicas queue shipped requests and preempt."""
    rng = np.random.default_rng(seed)
    cfg = small_config(strategy=WALK_STRATEGIES[seed], kernel="none", seed=seed,
                       kv_slots=int(rng.choice([320, 384])), max_model_len=320,
                       prefill_replicas=int(rng.integers(1, 3)), decode_replicas=int(rng.integers(1, 3)),
                       num_requests=40, rate=float(rng.uniform(200, 800)),
                       workload="multi-turn" if seed % 2 else "alpaca-like",
                       preemption=str(rng.choice(["recompute", "swap"])), swap_gib=0.01,
                       chunked_prefill=bool(rng.integers(0, 2)), kv_link_gb_s=float(rng.choice([0.05, 25.0])),
                       admission=str(rng.choice(["fcfs", "skip"])), watermark_frac=float(rng.choice([0.0, 0.05])),
                       router=str(rng.choice(["round-robin", "least-loaded", "kv-exact", "cache-aware"])))
    from workbench.engine.simulation import make_replica
    from workbench.fleet.fleet import Member
    from workbench.fleet.registry import make_router

    res = cfg.resolve()
    requests = build_workload(cfg)
    strategies = [checked_strategy(cfg) for _ in range(cfg.num_engines)]
    members = [Member(make_replica(cfg, res, s, [], "none")) for s in strategies]
    num_prefill = cfg.prefill_replicas
    for m in members[num_prefill:]:
        _no_prefill_but_recompute(m)
    router = make_router(cfg.router, num_prefill, block_size=cfg.block_size, seed=cfg.seed)
    loop = Checked(members[:num_prefill], members[num_prefill:], router, requests,
                   kv_bytes_per_token=res.kv_bytes_per_token, kv_link_gb_s=cfg.kv_link_gb_s)
    flow = loop.run()
    extras = [{"prefix_query_tokens": 0, "prefix_hit_tokens": 0, "prefix_evicted_blocks": 0, "kernel_backend": "none",
               "kernel_time_s": 0.0, "kernel_gbps": 0.0, "verify_max_rel_err": float("nan")} for _ in members]
    steps, table, summary = disaggregated.merge(cfg, members[:num_prefill], members[num_prefill:], requests, flow,
                                                extras, 0.0)
    assert loop.done == len(requests) and not loop.events and not any(loop.in_flight)
    assert table["request_id"].tolist() == [r.request_id for r in requests]
    assert (table["status"] == "finished").all()  # every request finishes, once: one row each
    multi = table["output_tokens"] > 1
    assert (table.loc[multi, "replica"] >= num_prefill).all()
    assert (table.loc[~multi, "replica"] == table.loc[~multi, "prefill_replica"]).all()
    assert (table.loc[multi, "first_token_s"] >= table.loc[multi, "kv_arrived_s"]).all()
    assert (table.loc[multi, "kv_arrived_s"] > table.loc[multi, "prefill_finish_s"]).all()
    finished_on_decode = sum(m.scheduler.log.num_finished for m in members[num_prefill:])
    assert finished_on_decode == int(multi.sum())
    on_prefill = steps[steps["replica"] < num_prefill]
    assert (on_prefill["num_decode_tokens"] == 0).all() and (on_prefill["preemptions"] == 0).all()
    assert summary["kv_transfer_bytes"] == int((table.loc[multi, "prompt_tokens"]).sum()) * res.kv_bytes_per_token
    for s in strategies:
        s.check_integrity()


def test_a_hybrid_pool_takes_shipped_prompts_longer_than_its_window():
    """gpt-oss-20b's window layers (128 tokens) and full layers each get the shipped rows through their own
    slot mapping, and decode attention over both tables matches the reference."""
    from workbench.engine.simulation import run

    cfg = RunConfig(strategy="paged", model="gpt-oss-20b", max_model_len=1024, kernel_heads=1, kernel="numba",
                    workload="fixed:prompt=150,output=200", num_requests=6, rate=1000.0, block_size=16, seed=3,
                    kv_slots=4000, verify_every=1, prefill_replicas=1, decode_replicas=1)
    summary = run(cfg)
    assert summary["num_finished"] == 6 and summary["verify_max_rel_err"] <= 1e-2
    assert summary["kv_transfer_bytes"] == 6 * 150 * cfg.resolve().kv_bytes_per_token


@pytest.mark.parametrize(("strategy", "preemption"), [("radix", "recompute"), ("paged", "swap")])
def test_chunked_prefill_and_preemption_on_both_sides_verify(strategy, preemption):
    """Chunked prefill on every replica, small pools under a high rate: prefills in chunks on the prefill side,
    shipped prompts landing whole on the decode side, preemptions there recomputing in chunks or swapping;
    the kernels check every step."""
    cfg = small_config(strategy=strategy, prefill_replicas=1, decode_replicas=2, kv_slots=384, max_model_len=320,
                       workload="multi-turn", num_requests=24, rate=400.0, chunked_prefill=True,
                       max_num_batched_tokens=64, max_num_seqs=16, preemption=preemption, swap_gib=0.01)
    result = run_pd(cfg, build_workload(cfg))
    summary, steps = result.summary, result.steps
    assert summary["num_finished"] == 24 and summary["verify_max_rel_err"] <= tolerance("fp32")
    decode = steps[steps["replica"] >= 1]
    assert decode["preemptions"].sum() > 0
    assert (decode["swapped_blocks"].sum() > 0) == (preemption == "swap")
    assert (decode["num_prefill_tokens"].sum() > 0) == (preemption == "recompute")
