"""Static batching (`--batching static`, FasterTransformer-style): a batch is admitted into an empty engine and
runs, with nothing joining it, until its longest request ends (workbench.engine.rules.admits_now)."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.engine.conftest import checked_strategy, replace, simulate_checked, small_config
from tests.engine.test_engine_strategies import check_run
from workbench.allocators import registry
from workbench.allocators.base import Strategy
from workbench.allocators.paged.strategy import PagedStrategy
from workbench.engine import simulate
from workbench.engine.scheduler import Scheduler
from workbench.workload.request import Request, Segment

# (prompt, output) of four requests arriving together, two sequences at most on the device
HAND = [(10, 3), (10, 6), (10, 2), (10, 4)]


def _hand_run(batching: str):
    requests = [Request(i, 0.0, p, o, (Segment(1000 + i, p),)) for i, (p, o) in enumerate(HAND)]
    cfg = small_config(kernel="none", num_requests=len(HAND), max_num_seqs=2, batching=batching)
    result = simulate(cfg, requests, checked_strategy(cfg))
    work = list(zip(result.steps["num_prefill_tokens"], result.steps["num_decode_tokens"], strict=True))
    return result, work, result.steps["t_s"].to_numpy()


def test_a_static_batch_runs_to_its_longest_request_before_the_next_is_admitted():
    # By hand: a request's prefill step makes its first token, then it decodes output - 1 more steps.
    # Static: steps 1-6 run the batch {0, 1}; 0 ends at step 3, 1 (the longest, 6 tokens) at step 6 and
    # steps 4-6 decode it alone while 2 and 3 wait; step 7 prefills {2, 3}, 2 ends at step 8, 3 at step 10.
    result, work, t = _hand_run("static")
    assert work == [(20, 0), (0, 2), (0, 2), (0, 1), (0, 1), (0, 1), (20, 0), (0, 2), (0, 1), (0, 1)]
    req = result.requests.set_index("request_id")
    assert list(result.steps["num_waiting"]) == [2] * 6 + [0] * 4
    ends = {0: 3, 1: 6, 2: 8, 3: 10}  # the step each request's last token comes out of
    for i, step in ends.items():
        assert req.loc[i, "finish_s"] == t[step - 1]
    # the second batch is admitted together, when the first batch's longest request has ended
    assert req.loc[2, "admitted_s"] == req.loc[3, "admitted_s"] == req.loc[1, "finish_s"]
    # each step is charged for the work it does: the second batch's prefill costs what the first's did
    assert result.steps["dt_s"].iloc[6] == result.steps["dt_s"].iloc[0]

    # Continuous batching on the same requests admits 2 at step 4 (0 ended at step 3) and 3 at step 6
    # (2 ended at step 5): 9 steps, one fewer than static batching's 10.
    result, work, t = _hand_run("continuous")
    assert work == [(20, 0), (0, 2), (0, 2), (10, 1), (0, 2), (10, 1), (0, 1), (0, 1), (0, 1)]
    assert list(result.requests.sort_values("request_id")["finish_s"]) == [t[2], t[5], t[4], t[8]]


# a pool small enough that the paged strategies preempt a batch's latest request (recompute, or swap), which
# then waits for the next batch; kernels verified at every step. The quick run takes one strategy of each
# kind (blocks, contiguous extents); the full run every strategy and swapping.
QUICK = {("paged", "recompute"), ("contiguous-oracle", "recompute")}
CASES = [pytest.param(strategy, preemption, marks=() if (strategy, preemption) in QUICK else pytest.mark.slow)
         for strategy, preemption in [(s, "recompute") for s in registry.names()] + [("paged", "swap")]]


@pytest.mark.parametrize("strategy,preemption", CASES)
def test_static_batching_serves_every_request_and_keeps_the_accounting(strategy, preemption):
    cfg = small_config(strategy=strategy, workload="sharegpt-like", num_requests=12, rate=20.0, kv_slots=640,
                       preemption=preemption, batching="static")
    result = simulate_checked(cfg)
    check_run(result, cfg)  # every request finishes; the six-way partition of the pool holds at every step
    steps = result.steps
    if strategy == "paged":
        assert steps["preemptions"].sum() > 0
    # nothing is admitted (or swapped back in) beside a running batch: a step prefills or decodes, never both
    assert not ((steps["num_prefill_tokens"] > 0) & (steps["num_decode_tokens"] > 0)).any()
    continuous = simulate_checked(replace(cfg, batching="continuous")).steps
    if strategy != "contiguous-max":  # which holds one request of max_model_len at a time in this pool
        assert ((continuous["num_prefill_tokens"] > 0) & (continuous["num_decode_tokens"] > 0)).any()


@pytest.mark.parametrize("fanout", [{"n": 2}, {"beam_width": 2}])
@pytest.mark.parametrize("strategy", ["paged", "contiguous-oracle"])
def test_static_batches_of_groups_take_the_plain_paths_tables(monkeypatch, strategy, fanout):
    """Parallel samples and beams batch statically too, and the decode-only path (taken while a batch runs
    and nothing waits) gives the general path's tables bit for bit."""
    cfg = small_config(strategy=strategy, kernel="none", workload="alpaca-like", num_requests=16, rate=60.0,
                       kv_slots=1024, batching="static", **fanout)
    fast = simulate_checked(cfg)
    steps = fast.steps
    assert fast.summary["num_finished"] == cfg.num_requests
    assert not ((steps["num_prefill_tokens"] > 0) & (steps["num_decode_tokens"] > 0)).any()
    monkeypatch.setattr(Scheduler, "lean_decode_steps", False)
    monkeypatch.setattr(PagedStrategy, "append_if_room", Strategy.append_if_room)
    plain = simulate_checked(cfg)
    pd.testing.assert_frame_equal(fast.steps, plain.steps, check_exact=True)
    pd.testing.assert_frame_equal(fast.requests, plain.requests, check_exact=True)
