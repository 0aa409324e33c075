"""The engine times the attention kernels alone: the input checks (which read descriptors back to the host,
a device-to-host copy on a GPU) and the launch plans run before its clock starts."""

from __future__ import annotations

import time
import types

from tests.engine.conftest import simulate_checked, small_config
from workbench.kernels import validation


def test_no_input_check_runs_inside_the_timed_region(monkeypatch):
    events: list[str] = []
    real_check = validation.check_query

    def check_query(*args):
        events.append("check")
        return real_check(*args)

    def perf_counter():
        events.append("clock")
        return time.perf_counter()

    monkeypatch.setattr(validation, "check_query", check_query)
    monkeypatch.setattr("workbench.engine.runner.time", types.SimpleNamespace(perf_counter=perf_counter))
    simulate_checked(small_config(strategy="paged", workload="fixed:prompt=30,output=6", num_requests=3,
                                  rate=100.0))
    clocks = [i for i, e in enumerate(events) if e == "clock"]
    assert len(clocks) >= 2 and len(clocks) % 2 == 0 and "check" in events
    starts, stops = clocks[::2], clocks[1::2]
    assert all(stop == start + 1 for start, stop in zip(starts, stops, strict=True))  # nothing checked in between
