"""The compiled loop runs `paged-prefix` (hash index, LRU) with the general loop's tables, summary and counters,
value for value, and leaves the strategy as a general run does.

Workloads are drawn so that prompts share heads (a few system prompts), continue earlier answers (multi-turn:
a decode-filled block is hit later), repeat whole earlier prompts (a hit that stops one token short), and
reach every way a request ends; small pools evict cached blocks and preempt for recompute (a readmitted prompt
hashes what it generated too)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

from tests.engine.conftest import small_config
from tests.engine.test_compiled_paged import (
    MAX_MODEL_LEN,
    assert_same,
    count_drives,
    drawn,
    run_both,
    states_after_both_loops,
)
from workbench.allocators import registry
from workbench.config import RunConfig
from workbench.engine import simulate
from workbench.workload import build_workload
from workbench.workload.request import Request, Segment, output_key


def shared_workload(seed: int, num: int, burst: bool) -> list[Request]:
    """Prompts of a shared head (one of three, 0-200 tokens), maybe an earlier request's prompt and answer,
    and a tail of their own; some repeat an earlier prompt whole, some pass max_model_len."""
    rng = np.random.default_rng(seed)
    heads = [Segment(10**9 + k, int(rng.integers(1, 200))) for k in range(3)]
    arrival = np.zeros(num) if burst else np.cumsum(rng.exponential(0.02, num))
    requests: list[Request] = []
    for i in range(num):
        output = 1 if rng.random() < 0.2 else int(rng.integers(1, 80))
        if requests and rng.random() < 0.15:  # the same prompt again
            content = requests[int(rng.integers(len(requests)))].content
        else:
            content = (heads[int(rng.integers(3))],) if rng.random() < 0.8 else ()
            if requests and rng.random() < 0.4:  # the next turn of an earlier request
                before = requests[int(rng.integers(len(requests)))]
                content = (*before.content, Segment(output_key(before.request_id, 0), before.output_tokens))
            content = (*content, Segment(i, int(rng.integers(1, 120))))
        prompt = sum(s.length for s in content)
        if prompt + output > MAX_MODEL_LEN and rng.random() < 0.7:  # most fit; the rest are rejected on arrival
            content, prompt = (Segment(i, 100),), 100
        requests.append(Request(i, float(arrival[i]), prompt, output, content))
    return requests


CONFIGS = dict(block_size=st.sampled_from([1, 4, 16, 64]), kv_slots=st.integers(520, 8000),
               max_num_seqs=st.sampled_from([1, 6, 64]), watermark_frac=st.sampled_from([0.0, 0.1]),
               max_num_batched_tokens=st.sampled_from([None, 700]), burst=st.booleans(), seed=st.integers(0, 2**16))


def _both_loops(monkeypatch, block_size, kv_slots, max_num_seqs, watermark_frac, max_num_batched_tokens, burst,
                seed) -> None:
    cfg = small_config(strategy="paged-prefix", block_size=block_size, kv_slots=kv_slots, max_num_seqs=max_num_seqs,
                       watermark_frac=watermark_frac, max_num_batched_tokens=max_num_batched_tokens, kernel="none",
                       seed=seed)
    assert_same(*run_both(cfg, shared_workload(seed, 80, burst), monkeypatch))


@drawn(25, CONFIGS)
def test_compiled_prefix_loop_gives_the_general_tables(monkeypatch, **draw):
    _both_loops(monkeypatch, **draw)


@pytest.mark.slow
@drawn(300, CONFIGS)
def test_compiled_prefix_loop_gives_the_general_tables_long(monkeypatch, **draw):
    _both_loops(monkeypatch, **draw)


def test_the_draws_hit_evict_and_preempt(monkeypatch):
    """A run of the family above that hits (decode-filled blocks among them), evicts, preempts and rejects."""
    cfg = small_config(strategy="paged-prefix", block_size=4, kv_slots=1200, max_num_seqs=64, kernel="none")
    compiled, general = run_both(cfg, shared_workload(7, 300, burst=False), monkeypatch)
    assert_same(compiled, general)
    assert compiled.requests["prefix_hit_tokens"].sum() > 0
    assert compiled.steps["cached_slots"].max() > 0
    assert compiled.steps["preemptions"].sum() > 0
    assert compiled.requests["status"].str.contains("max_model_len").any()
    assert compiled.summary["prefix_evicted_blocks"] > 0


@pytest.mark.parametrize(("block_size", "burst"), [(1, True), (16, False)])
def test_the_cache_ends_as_a_general_run_leaves_it(monkeypatch, block_size, burst):
    """After a compiled run the strategy's integrity holds and its free stack, refcounts, cached blocks in
    eviction order, registered blocks, key count and counters are a general run's (300 requests at once grow
    the rows and, past 512 keys, the index's table; block size 1 widens the block tables)."""
    cfg = small_config(strategy="paged-prefix", block_size=block_size, kv_slots=30000, max_num_seqs=256,
                       max_num_batched_tokens=100000, kernel="none")

    def state_of(strategy):
        return (strategy._free.ids().tolist(), strategy._refcount.tolist(), strategy.tables.seqs.capacity_rows,
                strategy.cached_block_ids().tolist(), strategy.registered_block_ids().tolist(),
                strategy.prefix._num_keys, strategy.counters(), *strategy.counts.tolist(), strategy.snapshot())

    states = states_after_both_loops(monkeypatch, cfg, shared_workload(11, 300, burst), state_of)
    assert states[0] == states[1]
    assert states[0][5] > 512  # the key table grew past its first 1024 slots


@pytest.mark.parametrize("workload", ["sharegpt-like", "multi-turn", "system-prompt"])
def test_built_in_workloads_as_columns(monkeypatch, workload):
    """Built-in workloads (columns: one segment per prompt, or segment tuples) through both loops."""
    cfg = RunConfig(strategy="paged-prefix", model="opt-13b", gpu="a100-40gb", workload=workload, rate=8.0,
                    num_requests=300, kernel="none", kv_gib=2)
    compiled, general = run_both(cfg, build_workload(cfg), monkeypatch)
    assert_same(compiled, general)
    if workload != "sharegpt-like":
        assert compiled.requests["prefix_hit_tokens"].sum() > 0


@pytest.mark.parametrize("options", [dict(eviction="lfu"), dict(strategy="radix"), dict(host_cache_gib=0.001),
                                     dict(n=2)])
def test_other_prefix_cases_take_the_general_loop(monkeypatch, options):
    """Another eviction order, the radix tree, a host tier or several samples: the general loop runs them."""
    taken = count_drives(monkeypatch)
    cfg = small_config(**{"strategy": "paged-prefix", "kernel": "none", "num_requests": 6, **options})
    simulate(cfg, build_workload(cfg), registry.create_from_config(cfg, cfg.resolve()))
    assert taken == []
