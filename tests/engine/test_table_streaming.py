"""A run's tables stream to Parquet in chunks while it runs: the files, their schemas and the summary are
the ones the whole tables in memory give, the request rows are let go as requests finish, and a run
that fails mid-way leaves nothing behind."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from workbench import table_sink
from workbench.allocators import registry
from workbench.config import RunConfig
from workbench.engine import simulation
from workbench.engine.compiled_paged import drive as compiled_drive
from workbench.engine.compiled_paged import eligible as compiled_eligible
from workbench.engine.request_log import RequestLog
from workbench.engine.simulation import run, simulate
from workbench.table_sink import MemorySink, ParquetSink
from workbench.workload import build_workload

# preemptions (a small pool), rejections (prompt + output over max_model_len) and saturated steps
CASES = [
    dict(strategy="paged", block_size=16, workload="sharegpt-like", rate=30.0, num_requests=300, kv_slots=6000,
         max_model_len=1024, kernel="none"),
    dict(strategy="contiguous-pow2", workload="alpaca-like", rate=50.0, num_requests=250, kv_slots=4096,
         kernel="none"),
    dict(strategy="paged-prefix", block_size=8, workload="system-prompt:k=3,system=64", rate=20.0,
         num_requests=200, kv_slots=8192, kernel="numba", kernel_heads=1, verify_every=7),
]


@pytest.mark.parametrize("case", CASES, ids=[c["strategy"] for c in CASES])
def test_streamed_run_files_equal_the_tables_held_in_memory(case, tmp_path, monkeypatch):
    monkeypatch.setattr(table_sink, "ROWS_PER_CHUNK", 37)  # many chunks, cut anywhere
    cfg = RunConfig(**case)
    summary = run(cfg, tmp_path / "out")
    memory = simulate(cfg, build_workload(cfg), registry.create_from_config(cfg, cfg.resolve()))
    for name, frame in (("steps", memory.steps), ("requests", memory.requests)):
        streamed = pq.read_table(tmp_path / "out" / f"{name}.parquet")
        assert pq.ParquetFile(tmp_path / "out" / f"{name}.parquet").num_row_groups > 1
        frame.to_parquet(tmp_path / f"{name}.parquet", index=False)
        whole = pq.read_table(tmp_path / f"{name}.parquet")
        assert streamed.schema.equals(whole.schema, check_metadata=True)
        assert streamed.equals(whole)
    written = json.loads((tmp_path / "out" / "summary.json").read_text())
    for key in ("sim_wall_s", "kernel_time_s", "kernel_gbps"):
        summary.pop(key), written.pop(key), memory.summary.pop(key)
    assert json.dumps(summary) == json.dumps(written)
    assert json.dumps(summary, sort_keys=True) == json.dumps(memory.summary, sort_keys=True)  # NaN-safe, bit for bit


def test_parquet_sink_writes_what_to_parquet_writes(tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.integers(0, 9, 100), "b": rng.random(100),
                          "c": [f"rejected: {i}" if i % 7 else "finished" for i in range(100)]})
    frame.loc[3, "b"] = np.nan
    sink = ParquetSink(tmp_path)
    for lo in range(0, 100, 30):
        sink.append("t", frame.iloc[lo:lo + 30].reset_index(drop=True))
    sink.close()
    frame.to_parquet(tmp_path / "whole.parquet", index=False)
    streamed, whole = pq.read_table(tmp_path / "t.parquet"), pq.read_table(tmp_path / "whole.parquet")
    assert streamed.schema.equals(whole.schema, check_metadata=True) and streamed.equals(whole)
    assert pd.concat(sink.chunks("t", ["c", "a"]), ignore_index=True).equals(frame[["c", "a"]])


def test_parquet_sink_refuses_a_chunk_whose_columns_changed(tmp_path):
    sink = ParquetSink(tmp_path)
    sink.append("t", pd.DataFrame({"a": [1, 2]}))
    with pytest.raises(ValueError, match="differ from the first chunk"):
        sink.append("t", pd.DataFrame({"a": [0.5]}))


def test_request_log_lets_rows_go_once_every_earlier_request_is_done():
    """A random order of events on 2,000 requests, rows taken out whenever the done prefix allows: the
    chunks add up to the log kept whole, and the log never holds more than the requests in flight."""
    rng = np.random.default_rng(1)
    num = 2000
    requests = build_workload(RunConfig(workload="alpaca-like", num_requests=num))
    whole, streamed = RequestLog(num), RequestLog(num)
    chunks, widest = [], 0
    order = np.argsort(np.arange(num) + rng.integers(0, 40, num))  # each finishes within ~40 of its arrival
    for step, i in enumerate(order.tolist()):
        hit_tokens = int(rng.integers(0, 3))
        for log in (whole, streamed):
            log.admitted(i, step * 0.5, hit_tokens)
            if i % 11 == 5:
                log.rejected(i, "too long")
            else:
                log.first_token(i, step * 0.5 + 0.25)
                log.finished(i, step * 0.5 + 1.0, 7)
        widest = max(widest, streamed.ready - streamed.base, streamed.done.shape[0])
        if rng.random() < 0.05:
            chunk = streamed.take_done(requests)
            if chunk is not None:
                chunks.append(chunk)
    chunks.append(streamed.take_done(requests))
    assert streamed.take_done(requests) is None and streamed.base == num
    assert pd.concat(chunks, ignore_index=True).equals(whole.to_frame(requests))
    assert widest <= 1024  # the window's first size: it never had to grow for 40 requests in flight
    assert (streamed.num_finished, streamed.num_rejected, streamed.generated_tokens) == \
        (whole.num_finished, whole.num_rejected, whole.generated_tokens)


def test_a_run_holds_the_rows_of_the_requests_in_flight_only(monkeypatch):
    """20,000 requests at a light load, through the general loop: the request log's window and the step
    buffer stay small."""
    monkeypatch.setattr(table_sink, "ROWS_PER_CHUNK", 512)
    monkeypatch.setattr(compiled_eligible, "ENABLED", False)
    cfg = RunConfig(strategy="paged", workload="alpaca-like", rate=20.0, num_requests=20_000, kernel="none")
    seen = {}
    drive = simulation._drive

    def watched(replica, progress, sink):
        original = replica.step

        def step(at_s=None):
            finished = original(at_s)
            log = replica.scheduler.log
            seen["window"] = max(seen.get("window", 0), log.done.shape[0])
            seen["buffer"] = max(seen.get("buffer", 0), replica.steps.buffered_rows)
            seen["live"] = max(seen.get("live", 0), len(replica.scheduler.tokens._unkeyed))
            return finished
        replica.step = step
        drive(replica, progress, sink)

    monkeypatch.setattr(simulation, "_drive", watched)
    sink = MemorySink()
    simulation.simulate_into(cfg, build_workload(cfg), registry.create_from_config(cfg, cfg.resolve()), sink)
    assert seen["window"] <= 2048 and seen["buffer"] <= 512 and seen["live"] <= 512
    assert len(sink.frame("requests")) == 20_000


def test_a_compiled_run_holds_the_rows_of_the_requests_in_flight_only(monkeypatch):
    """The same through the compiled loop of plain `paged` runs: the request window, the loop's per-request
    rings and the step buffer stay small."""
    monkeypatch.setattr(table_sink, "ROWS_PER_CHUNK", 512)
    cfg = RunConfig(strategy="paged", workload="alpaca-like", rate=20.0, num_requests=20_000, kernel="none")
    seen = {"calls": 0}
    call = compiled_drive._Run.call

    def watched(run):
        status = call(run)
        seen["calls"] += 1
        seen["window"] = max(seen.get("window", 0), run.log.done.shape[0])
        seen["rings"] = max(seen.get("rings", 0), run.g_row.shape[0], run.wait.shape[0])
        seen["buffer"] = max(seen.get("buffer", 0), run.replica.steps.buffered_rows)
        return status

    monkeypatch.setattr(compiled_drive._Run, "call", watched)
    sink = MemorySink()
    simulation.simulate_into(cfg, build_workload(cfg), registry.create_from_config(cfg, cfg.resolve()), sink)
    assert seen["calls"] > 10
    assert seen["window"] <= 2048 and seen["rings"] <= 2048 and seen["buffer"] <= 512
    assert len(sink.frame("requests")) == 20_000


def test_a_run_that_fails_midway_leaves_no_output_and_no_staging_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(table_sink, "ROWS_PER_CHUNK", 50)
    appended = []
    original = ParquetSink.append

    def failing(self, name, frame):
        appended.append(name)
        if len(appended) == 3:
            raise OSError(28, "No space left on device")
        original(self, name, frame)

    monkeypatch.setattr(ParquetSink, "append", failing)
    cfg = RunConfig(strategy="paged", workload="alpaca-like", rate=20.0, num_requests=400, kernel="none")
    with pytest.raises(OSError, match="No space left"):
        run(cfg, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_a_grown_log_holds_a_row_for_every_request_given():
    """A fleet replica's log is read by its router for requests routed and not yet admitted."""
    log = RequestLog()
    for i in range(3000):
        log.grow(1)
        assert log.status_of(i) == "pending" and np.isnan(log.admitted_s[i])
    log.finished(2999, 1.0, 5)
    assert log.status[2999] == "finished" and log.ready == 0
