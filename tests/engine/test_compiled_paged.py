"""The compiled loop of plain `paged` runs (workbench.engine.compiled_paged) gives the general loop's tables and
summary, value for value, and serves no other run.

Randomized over pool sizes, block sizes, batch limits, the watermark, the token budget, tensor parallelism
and both clock profiles, on workloads drawn to reach every way a request ends: finished (one output token or
many), rejected on arrival (longer than max_model_len), rejected at admission (more blocks than the pool holds
above the watermark, or than it holds at all), and preempted for recompute first."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.conftest import SMALL_MODEL, small_config, summaries_equal
from workbench import table_sink
from workbench.allocators import registry
from workbench.config import RunConfig
from workbench.engine import simulate
from workbench.engine.compiled_paged import drive as compiled_drive
from workbench.engine.compiled_paged import eligible
from workbench.engine.simulation import make_replica
from workbench.results import FLOAT_STEP_COLUMNS, INT_STEP_COLUMNS, STEPS_TABLE, StepLog
from workbench.table_sink import MemorySink
from workbench.workload import build_workload
from workbench.workload.request import Request, Segment

MAX_MODEL_LEN = 512  # SMALL_MODEL's


def hand_workload(seed: int, num: int, burst: bool) -> list[Request]:
    """Requests of every fate: prompts up to past max_model_len, outputs from 1 token, arrivals spread or
    all at once."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(1, 400, num)
    output = np.where(rng.random(num) < 0.2, 1, rng.integers(1, 120, num))
    near = rng.random(num) < 0.05  # fits max_model_len, not always the pool
    prompt[near], output[near] = MAX_MODEL_LEN - 6, rng.integers(1, 6, near.sum())
    grows = rng.random(num) < 0.05  # grows past a pool of 500 slots
    prompt[grows], output[grows] = MAX_MODEL_LEN - 20, rng.integers(15, 20, grows.sum())
    prompt[rng.random(num) < 0.05] = MAX_MODEL_LEN  # too long with any output
    arrival = np.zeros(num) if burst else np.cumsum(rng.exponential(0.02, num))
    return [Request(i, float(arrival[i]), int(prompt[i]), int(output[i]), (Segment(i, int(prompt[i])),))
            for i in range(num)]


def count_drives(monkeypatch) -> list:
    """A list that each run taking the compiled loop appends to."""
    taken = []
    drive = compiled_drive.drive
    monkeypatch.setattr(compiled_drive, "drive", lambda *a: taken.append(1) or drive(*a))
    return taken


def run_both(cfg: RunConfig, requests, monkeypatch):
    """(compiled, general) results of one run; the compiled one is checked to have taken the compiled loop."""
    taken = count_drives(monkeypatch)
    compiled = simulate(cfg, requests, registry.create_from_config(cfg, cfg.resolve()))
    assert taken == [1]
    monkeypatch.setattr(eligible, "ENABLED", False)
    general = simulate(cfg, requests, registry.create_from_config(cfg, cfg.resolve()))
    assert taken == [1]
    monkeypatch.setattr(eligible, "ENABLED", True)
    return compiled, general


def assert_same(a, b) -> None:
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    assert summaries_equal(a.summary, b.summary)


def drawn(max_examples: int, configs: dict):
    """A test of both loops run on `max_examples` configurations drawn from `configs` (Hypothesis strategies by
    argument); the test takes pytest's function-scoped monkeypatch, which its draws share."""
    return lambda test: settings(max_examples=max_examples, deadline=None, suppress_health_check=[
        HealthCheck.too_slow, HealthCheck.function_scoped_fixture])(given(**configs)(test))


CONFIGS = dict(block_size=st.sampled_from([1, 3, 8, 16, 100]), kv_slots=st.integers(520, 6000),
               max_num_seqs=st.sampled_from([1, 5, 64]), watermark_frac=st.sampled_from([0.0, 0.05, 0.4]),
               max_num_batched_tokens=st.sampled_from([None, 700]), tp=st.sampled_from([1, 2]),
               burst=st.booleans(), seed=st.integers(0, 2**16))


@drawn(30, CONFIGS)
def test_compiled_loop_gives_the_general_tables(monkeypatch, block_size, kv_slots, max_num_seqs, watermark_frac,
                                                max_num_batched_tokens, tp, burst, seed):
    cfg = small_config(strategy="paged", block_size=block_size, kv_slots=kv_slots, max_num_seqs=max_num_seqs,
                       watermark_frac=watermark_frac, max_num_batched_tokens=max_num_batched_tokens, tp=tp,
                       kernel="none", seed=seed)
    requests = hand_workload(seed, 60, burst)
    assert_same(*run_both(cfg, requests, monkeypatch))


@pytest.mark.parametrize(("block_size", "max_num_seqs", "burst"), [(1, 64, False), (8, 200, True), (100, 5, True)])
def test_the_strategy_ends_as_a_general_run_leaves_it(monkeypatch, block_size, max_num_seqs, burst):
    """The loop works on the strategy's own arrays: afterwards its integrity holds and its free stack, block
    refcounts, rows and counters are those a general run leaves (200 requests at once grow the rows past their
    first 64; block size 1 widens the tables)."""
    cfg = small_config(strategy="paged", block_size=block_size, kv_slots=40000, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=100000, kernel="none")

    def state_of(strategy):
        seqs = strategy.tables.seqs
        return (strategy._free.ids().tolist(), strategy._refcount.tolist(), seqs._free_rows, seqs.capacity_rows,
                strategy.tables._table.shape, *strategy.counts.tolist(), strategy.snapshot())

    states = states_after_both_loops(monkeypatch, cfg, hand_workload(3, 200, burst), state_of)
    assert states[0] == states[1]
    if burst and max_num_seqs > 64:
        assert states[0][3] > 64


def states_after_both_loops(monkeypatch, cfg: RunConfig, requests, state_of) -> list:
    """[`state_of(strategy)` after a compiled run, after a general run] of `requests`, each strategy's integrity
    checked; the first run is checked to have taken the compiled loop."""
    taken = count_drives(monkeypatch)
    states = []
    for enabled in (True, False):
        monkeypatch.setattr(eligible, "ENABLED", enabled)
        strategy = registry.create_from_config(cfg, cfg.resolve())
        simulate(cfg, requests, strategy)
        strategy.check_integrity()
        states.append(state_of(strategy))
    assert taken == [1]
    return states


def test_every_way_a_request_ends_is_drawn(monkeypatch):
    """Runs of the randomized family that reach each fate: the comparison above covers them. A pool of five
    100-slot blocks holds less than max_model_len: a prompt can need more blocks than it has, and a lone
    sequence can outgrow it."""
    cfg = small_config(strategy="paged", block_size=8, kv_slots=560, max_num_seqs=64, watermark_frac=0.1,
                       kernel="none")
    compiled, general = run_both(cfg, hand_workload(5, 200, burst=False), monkeypatch)
    assert_same(compiled, general)
    status = compiled.requests["status"]
    assert (status == "finished").any()
    assert (compiled.requests.loc[status == "finished", "output_tokens"] == 1).any()
    assert status.str.contains("max_model_len").any()
    assert status.str.contains("above the watermark").any()
    assert compiled.steps["preemptions"].sum() > 0
    assert compiled.steps["preemptions"].sum() == compiled.requests["num_preemptions"].sum()  # each in a step row
    cfg = small_config(strategy="paged", block_size=100, kv_slots=520, watermark_frac=0.0, kernel="none")
    compiled, general = run_both(cfg, hand_workload(6, 200, burst=False), monkeypatch)
    assert_same(compiled, general)
    status = compiled.requests["status"]
    assert status.str.contains("blocks, 5 allocatable").any()
    assert status.str.contains("the whole pool").any()


def test_separate_prefill_clock_and_columns_workload(monkeypatch):
    """The calibrated profile that prices prompts and decodes as separate iterations, on a columns workload."""
    cfg = RunConfig(strategy="paged", model="opt-13b", gpu="a100-40gb", clock_profile="vllm-sosp23-a100",
                    workload="sharegpt-like", rate=8.0, num_requests=400, kernel="none", kv_gib=2)
    compiled, general = run_both(cfg, build_workload(cfg), monkeypatch)
    assert_same(compiled, general)
    assert ((compiled.steps["num_prefill_tokens"] > 0) & (compiled.steps["num_decode_tokens"] > 0)).any()


def test_small_buffers_and_a_long_queue(monkeypatch):
    """Every stop of the loop: a step-row buffer of 7 rows, an event buffer of one, table chunks of 50 rows,
    and 3,000 requests arriving at once (queues past the request window's first size)."""
    monkeypatch.setattr(compiled_drive, "ROWS_PER_CALL", 7)
    monkeypatch.setattr(compiled_drive, "FIRST_EVENTS", 1)
    monkeypatch.setattr(table_sink, "ROWS_PER_CHUNK", 50)
    cfg = small_config(strategy="paged", block_size=16, kv_slots=2048, max_num_seqs=32, kernel="none")
    compiled, general = run_both(cfg, hand_workload(9, 3000, burst=True), monkeypatch)
    assert_same(compiled, general)
    assert compiled.steps["num_waiting"].max() > 2048


def test_a_run_without_requests(monkeypatch):
    cfg = small_config(strategy="paged", kernel="none")
    assert_same(*run_both(cfg, [], monkeypatch))


PLAIN = dict(strategy="paged", model=SMALL_MODEL, kv_slots=2048, kernel="none", workload="alpaca-like",
             num_requests=8)


def replica_for(**changes):
    cfg = RunConfig(**{**PLAIN, **changes})
    res = cfg.resolve()
    strategy = registry.create_from_config(cfg, res)
    backend = "none" if cfg.kernel == "none" else "numba"
    return make_replica(cfg, res, strategy, build_workload(cfg), backend)


def test_the_plain_case_applies():
    assert eligible.applies(replica_for())


def test_the_hash_prefix_cache_applies():
    assert eligible.applies(replica_for(strategy="paged-prefix"))


def test_virtual_contiguous_applies():
    assert eligible.applies(replica_for(strategy="virtual-contiguous", page_kib=64))


@pytest.mark.parametrize("name", [n for n in registry.names()
                                  if n not in ("paged", "paged-prefix", "virtual-contiguous")])
def test_no_other_strategy_applies(name):
    assert not eligible.applies(replica_for(**small_config(strategy=name, kernel="none", num_requests=8).to_dict()))


@pytest.mark.parametrize("changes", [
    dict(chunked_prefill=True), dict(preemption="swap"), dict(n=2), dict(beam_width=2), dict(admission="skip"),
    dict(kernel="numba", kv_dtype="fp32"), dict(model="gpt-oss-20b", max_model_len=2048, hybrid="off"),
    dict(model="gpt-oss-20b", max_model_len=2048)])
def test_no_other_run_applies(changes):
    assert not eligible.applies(replica_for(**changes))


def test_a_stepped_replica_does_not_apply():
    replica = replica_for()
    replica.step()
    assert not eligible.applies(replica)


@given(counts=st.lists(st.integers(0, 9), min_size=1, max_size=6), seed=st.integers(0, 2**16))
@settings(max_examples=25, deadline=None)
def test_rows_in_bulk_equal_rows_one_by_one(counts, seed):
    rng = np.random.default_rng(seed)
    floats = rng.random((sum(counts), len(FLOAT_STEP_COLUMNS)))
    ints = rng.integers(0, 3, (sum(counts), len(INT_STEP_COLUMNS)))
    one, bulk = StepLog(MemorySink()), StepLog(MemorySink())
    one.rows_per_chunk = bulk.rows_per_chunk = 4
    for f, i in zip(floats.tolist(), ints.tolist(), strict=True):
        one.record(tuple(f), tuple(i))
    start = 0
    for c in counts:
        bulk.record_rows(floats[start:start + c], ints[start:start + c])
        start += c
    assert (bulk.num_rows, bulk.num_saturated, bulk.buffered_rows) == (one.num_rows, one.num_saturated,
                                                                       one.buffered_rows)
    one.close()
    bulk.close()
    assert len(list(bulk.sink.chunks(STEPS_TABLE, ["t_s"]))) == len(list(one.sink.chunks(STEPS_TABLE, ["t_s"])))
    pd.testing.assert_frame_equal(bulk.sink.frame(STEPS_TABLE), one.sink.frame(STEPS_TABLE), check_exact=True)


def test_rows_of_the_wrong_width_are_refused():
    with pytest.raises(ValueError, match="step rows of shapes"):
        StepLog().record_rows(np.zeros((2, len(FLOAT_STEP_COLUMNS))), np.zeros((2, len(INT_STEP_COLUMNS) - 1)))


@pytest.mark.parametrize("model, tp, kv_gib", [("deepseek-v2-lite", 1, 0.5), ("deepseek-v3", 8, 4.0)])
def test_latent_and_mixture_of_experts_runs_give_the_general_tables(monkeypatch, model, tp, kv_gib):
    """A latent KV replicated over tensor-parallel GPUs and routed experts are in the clock constants and
    per-row times the compiled loop reads from the run's clock; it gives the general loop's tables."""
    cfg = RunConfig(strategy="paged", model=model, gpu="h200", tp=tp, hybrid="off", max_model_len=2048,
                    workload="sharegpt-like", rate=40.0, num_requests=200, kernel="none", kv_gib=kv_gib)
    compiled, general = run_both(cfg, build_workload(cfg), monkeypatch)
    assert_same(compiled, general)
