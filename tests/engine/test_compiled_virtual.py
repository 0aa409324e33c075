"""The compiled loop runs `virtual-contiguous` with the general loop's tables and summary, value for value, and
leaves the strategy as a general run does.

Randomized over page sizes (a page of 32 to 512 tokens of the small model), pools of a few pages to many, the
extents (`max_batch`: few enough that admissions wait for one), the reuse cache (released extents keep their
pages; reclaimed when free pages run out), the clock's map time and its overlap, the watermark and the token
budget, on workloads that reach every way a request ends (`hand_workload`)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import strategies as st

from tests.engine.conftest import small_config
from tests.engine.test_compiled_paged import (
    assert_same,
    count_drives,
    drawn,
    hand_workload,
    run_both,
    states_after_both_loops,
)
from workbench.allocators import registry
from workbench.config import RunConfig
from workbench.engine import simulate
from workbench.engine.compiled_paged import eligible
from workbench.workload import build_workload

CONFIGS = dict(page_kib=st.sampled_from([4, 8, 16, 64]), kv_slots=st.integers(520, 8000),
               max_batch=st.sampled_from([1, 4, 64]), page_reuse=st.sampled_from(["off", "on"]),
               map_us_per_page=st.sampled_from([None, 0.0, 500.0]), overlap_map=st.sampled_from(["off", "on"]),
               max_num_seqs=st.sampled_from([5, 64]), watermark_frac=st.sampled_from([0.0, 0.1]),
               max_num_batched_tokens=st.sampled_from([None, 700]), burst=st.booleans(), seed=st.integers(0, 2**16))


def _both_loops(monkeypatch, burst, seed, **options) -> None:
    cfg = small_config(strategy="virtual-contiguous", kernel="none", seed=seed, **options)
    assert_same(*run_both(cfg, hand_workload(seed, 60, burst), monkeypatch))


@drawn(25, CONFIGS)
def test_compiled_virtual_loop_gives_the_general_tables(monkeypatch, **draw):
    _both_loops(monkeypatch, **draw)


@pytest.mark.slow
@drawn(300, CONFIGS)
def test_compiled_virtual_loop_gives_the_general_tables_long(monkeypatch, **draw):
    _both_loops(monkeypatch, **draw)


def test_the_draws_map_reclaim_wait_and_preempt(monkeypatch):
    """A run of the family above that maps pages on demand (priced by the clock), reclaims cached pages, waits
    for an extent and preempts."""
    cfg = small_config(strategy="virtual-contiguous", page_kib=4, kv_slots=700, max_batch=4, page_reuse="on",
                       map_us_per_page=500.0, kernel="none")
    compiled, general = run_both(cfg, hand_workload(5, 200, burst=True), monkeypatch)
    assert_same(compiled, general)
    assert compiled.steps["num_running"].max() == 4  # every extent taken, the others waiting
    assert compiled.steps["cached_slots"].max() > 0
    assert compiled.steps["preemptions"].sum() > 0
    no_map = run_both(small_config(**{**cfg.to_dict(), "map_us_per_page": 0.0}), hand_workload(5, 200, True),
                      monkeypatch)[0]
    assert compiled.steps["dt_s"].sum() > no_map.steps["dt_s"].sum()  # mapping is priced


def test_a_prompt_the_empty_pool_cannot_map_is_rejected(monkeypatch):
    """A pool of 9 pages of 32 tokens (smaller than a run's configuration allows, built by hand) rejects the
    prompts longer than 288 tokens with the strategy's words, in both loops."""
    cfg = small_config(strategy="virtual-contiguous", page_kib=4, kv_slots=600, kernel="none")
    resolved = dataclasses.replace(cfg.resolve(), capacity_slots=300)
    results = []
    taken = count_drives(monkeypatch)
    for enabled in (True, False):
        monkeypatch.setattr(eligible, "ENABLED", enabled)
        results.append(simulate(cfg, hand_workload(8, 100, burst=False), registry.create_from_config(cfg, resolved)))
    assert taken == [1]
    assert_same(*results)
    assert results[0].requests["status"].str.contains("can be mapped").sum() > 3


@pytest.mark.parametrize(("page_reuse", "burst"), [("off", True), ("on", False)])
def test_the_pool_ends_as_a_general_run_leaves_it(monkeypatch, page_reuse, burst):
    """After a compiled run the strategy's integrity holds and its pages per extent, page counters, extent
    lengths, rows and the pages it reported are a general run's (200 requests at once grow the rows past their
    first 64)."""
    cfg = small_config(strategy="virtual-contiguous", page_kib=4, kv_slots=20000, max_batch=256,
                       page_reuse=page_reuse, max_num_seqs=256, max_num_batched_tokens=100000, kernel="none")

    def state_of(strategy):
        pages, seqs = strategy._pages, strategy._seqs
        return (pages.mapped.tolist(), pages.used.tolist(), pages.held.tolist(), pages.counts.tolist(),
                strategy._length.tolist(), strategy._final.tolist(), seqs._free_rows, seqs.capacity_rows,
                strategy._mapped_reported, strategy.counters(), strategy.snapshot())

    states = states_after_both_loops(monkeypatch, cfg, hand_workload(3, 200, burst), state_of)
    assert states[0] == states[1]
    if burst:
        assert states[0][7] > 64


def test_a_built_in_workload_as_columns(monkeypatch):
    cfg = RunConfig(strategy="virtual-contiguous", model="opt-13b", gpu="a100-40gb", workload="sharegpt-like",
                    rate=8.0, num_requests=300, kernel="none", kv_gib=2, page_kib=64)
    assert_same(*run_both(cfg, build_workload(cfg), monkeypatch))


@pytest.mark.parametrize("options", [dict(preemption="swap"), dict(chunked_prefill=True), dict(n=2)])
def test_other_virtual_cases_take_the_general_loop(monkeypatch, options):
    taken = count_drives(monkeypatch)
    cfg = small_config(**{"strategy": "virtual-contiguous", "kernel": "none", "num_requests": 6, **options})
    simulate(cfg, build_workload(cfg), registry.create_from_config(cfg, cfg.resolve()))
    assert taken == []
