"""Admission order (`--admission`): fcfs stops at the first waiting request the pool cannot place
(head-of-line blocking); skip lets later requests that fit pass it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.engine.conftest import checked_strategy, replace, simulate_checked, small_config
from workbench.allocators import registry
from workbench.engine import simulate
from workbench.workload.request import Request, Segment


def _overtakes(requests: pd.DataFrame) -> int:
    """How many requests were first admitted before a request that arrived earlier."""
    admitted = requests.sort_values("request_id")["admitted_s"].dropna().to_numpy()  # [num_admitted]
    return int(np.sum(admitted[1:] < np.maximum.accumulate(admitted)[:-1]))


@pytest.mark.parametrize("strategy", registry.names())
def test_fcfs_admits_in_arrival_order_and_skip_keeps_every_request(strategy):
    cfg = small_config(strategy=strategy, kernel="none", workload="alpaca-like", num_requests=80, rate=400.0,
                       kv_slots=1024)
    fcfs = simulate_checked(cfg)
    skip = simulate_checked(replace(cfg, admission="skip"))
    assert _overtakes(fcfs.requests) == 0
    for result in (fcfs, skip):
        statuses = result.requests["status"]
        assert statuses.map(lambda s: s == "finished" or s.startswith("rejected: ")).all()
        assert result.summary["num_finished"] + result.summary["num_rejected"] == 80


def _request(i: int, arrival_s: float, prompt: int, output: int) -> Request:
    return Request(i, arrival_s, prompt, output, (Segment(1000 + i, prompt),))


# (prompt, output) of three requests arriving together on an 800-slot pool: request 1 cannot be placed
# beside request 0 (contiguous-oracle reserves prompt + output, paged places the prompt's blocks),
# request 2 fits beside request 0 at once, but only skip admits it before request 0 finishes
BLOCKED_HEAD = {"contiguous-oracle": [(100, 350), (100, 350), (50, 100)], "paged": [(400, 50), (450, 50), (50, 50)]}


@pytest.mark.parametrize("strategy", sorted(BLOCKED_HEAD))
def test_skip_admits_a_small_request_past_a_blocked_head(strategy):
    requests = [_request(i, 0.001 * i, p, o) for i, (p, o) in enumerate(BLOCKED_HEAD[strategy])]
    cfg = small_config(strategy=strategy, kernel="none", kv_slots=800, num_requests=3, watermark_frac=0.0)
    runs = {}
    for admission in ("fcfs", "skip"):
        c = replace(cfg, admission=admission)
        runs[admission] = simulate(c, requests, checked_strategy(c)).requests.set_index("request_id")
    fcfs, skip = runs["fcfs"], runs["skip"]
    assert (fcfs["status"] == "finished").all() and (skip["status"] == "finished").all()
    assert fcfs.loc[2, "admitted_s"] >= fcfs.loc[1, "admitted_s"] >= fcfs.loc[0, "finish_s"]
    assert skip.loc[2, "admitted_s"] < skip.loc[0, "finish_s"] <= skip.loc[1, "admitted_s"]
