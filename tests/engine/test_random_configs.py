"""Randomized runs (hypothesis): under any strategy, pool size, fan-out (or speculation), preemption mode and
chunked prefill or not, the strategy's integrity holds after every step, the six-way partition is exact, no
request vanishes and every preemption is counted."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.conftest import simulate_checked, small_config
from workbench import columns as C
from workbench.allocators import registry
from workbench.config import RunConfig

CONFIGS = dict(
    strategy=st.sampled_from(registry.names()), block_size=st.sampled_from([1, 3, 8, 16]),
    kv_slots=st.integers(512, 3000),
    # fan-out, or speculative decoding (one sequence a request, K drafts a step)
    fanout=st.sampled_from([("n", 1), ("n", 2), ("n", 4), ("beam_width", 2), ("spec_tokens", 3), ("spec_tokens", 7)]),
    preemption=st.sampled_from(["recompute", "swap"]), fit=st.sampled_from(["first", "best", "buddy"]),
    # how a step fills its batch: chunked prefill or not, admission past a refused head, the queue's order (lpm
    # and dfs-weight where the strategy has the index they read) and the free-block watermark
    scheduling=st.fixed_dictionaries(dict(
        chunked_prefill=st.booleans(), admission=st.sampled_from(["fcfs", "skip"]),
        schedule=st.sampled_from(["fcfs", "lof", "random", "lpm", "dfs-weight"]),
        watermark_frac=st.sampled_from([0.0, 0.01, 0.1]))),
    workload=st.sampled_from(["alpaca-like", "sharegpt-like", "system-prompt:k=3,system=30,lengths=alpaca",
                              "multi-turn:turns=3,think=0.2,lengths=alpaca"]),
    seed=st.integers(0, 2**16))


# the registration's flag saying a strategy has the index a cache-aware order reads (docs/engine.md)
INDEX_READ = {"lpm": "prefix_cache", "dfs-weight": "prefix_tree"}


# The quick run draws 12 configurations, the full run 30 more (the same checks over more of the space)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**CONFIGS)
def test_random_configs_keep_every_invariant(strategy, block_size, kv_slots, fanout, preemption, fit, scheduling,
                                             workload, seed):
    check_random_config(strategy, block_size, kv_slots, fanout, preemption, fit, scheduling, workload, seed)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**CONFIGS)
def test_more_random_configs_keep_every_invariant(strategy, block_size, kv_slots, fanout, preemption, fit,
                                                  scheduling, workload, seed):
    check_random_config(strategy, block_size, kv_slots, fanout, preemption, fit, scheduling, workload, seed)


# The kernels too: every step's K/V written into the slots the strategy chose, attention over its tables or extents
# verified against the reference recomputed from the logical tokens (after swaps, copies, tier moves and
# preemptions). Full run only: a run with kernels costs several times one without.
@pytest.mark.slow
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**CONFIGS)
def test_random_configs_with_verified_kernels(strategy, block_size, kv_slots, fanout, preemption, fit, scheduling,
                                              workload, seed):
    check_random_config(strategy, block_size, kv_slots, fanout, preemption, fit, scheduling, workload, seed,
                        kernel="numba")


def random_config(strategy, block_size, kv_slots, fanout, preemption, fit, scheduling, workload, seed,
                  kernel="none", **model) -> RunConfig:
    """The drawn run's config; `model`: the model's config fields (the small dense model by default)."""
    reg = registry.get(strategy)
    options = {"fit": fit} if "fit" in reg.options else {}  # a run may set only the options its strategy takes
    if not getattr(reg, INDEX_READ.get(scheduling["schedule"], "name")):
        scheduling = {**scheduling, "schedule": "fcfs"}  # the order reads an index this strategy lacks
    return small_config(strategy=strategy, block_size=block_size, kv_slots=kv_slots, preemption=preemption,
                        workload=workload, seed=seed, kernel=kernel, num_requests=15, rate=50.0, swap_gib=1 / 4096,
                        **scheduling, **options, **model, **{fanout[0]: fanout[1]})


def check_random_config(*drawn, **fields):
    """The run of `random_config(*drawn, **fields)` and its invariants."""
    cfg = random_config(*drawn, **fields)
    reg = registry.get(cfg.strategy)
    result = simulate_checked(cfg)  # check_integrity runs before every step's snapshot
    steps, requests, summary = result.steps, result.requests, result.summary
    # the six parts, and a recurrent model's states beside them, are the pool (docs/memory.md, docs/recurrent.md)
    parts = list(C.SLOT_COLUMNS) + [c for c in C.STATE_STEP_COLUMNS if c in steps]
    assert (steps[parts].sum(axis=1) == summary["kv_slots"]).all()
    assert len(requests) == 15
    assert requests["status"].map(lambda s: s == "finished" or s.startswith("rejected: ")).all()
    assert summary["num_finished"] + summary["num_rejected"] == 15
    # every preemption is in a step row, those of a step that did not run in the next one's
    assert requests["num_preemptions"].sum() == steps["preemptions"].sum() == summary["num_preemptions"]
    allocated = steps["token_slots"] + steps["reserved_slots"] + steps["internal_frag_slots"]
    if reg.kernel_mode == "contiguous":
        assert (steps["cached_slots"] == 0).all()
        assert (steps["unshared_block_slots"] == allocated).all()  # nothing is shared
    else:
        assert (steps["external_frag_slots"] == 0).all()
        # sharing only ever saves whole blocks; with nothing to share the two counts agree exactly
        assert (steps["unshared_block_slots"] >= allocated).all()
        if not reg.prefix_cache and cfg.n == 1 and cfg.beam_width == 1:
            assert (steps["unshared_block_slots"] == allocated).all()
    finished = requests[requests["status"] == "finished"]
    assert (finished["finish_s"] >= finished["first_token_s"]).all()
    assert (finished["first_token_s"] > finished["arrival_s"]).all()
