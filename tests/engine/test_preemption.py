"""A pool too small for the load forces preemption; recompute and swap both lose nothing."""

from __future__ import annotations

import pytest

from tests.engine.conftest import checked_strategy, simulate_checked, small_config
from workbench import columns as C
from workbench.allocators import registry
from workbench.engine import reasons, simulate
from workbench.engine.request_log import rejected_status
from workbench.workload.request import Request, Segment

PAGED = [reg.name for reg in registry.registrations() if reg.kernel_mode == "paged"]
CONTIGUOUS = [reg.name for reg in registry.registrations() if reg.family == "contiguous"]  # reserve final lengths


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("strategy", PAGED)
def test_tiny_pool_preempts_and_still_verifies(strategy, mode, n):
    # 512 slots hold ~3 of these requests (one group of 3 samples) at once; 1 MiB of host swap is plenty
    cfg = small_config(strategy=strategy, kv_slots=512, max_model_len=256, preemption=mode, swap_gib=1 / 1024, n=n,
                       workload="fixed:prompt=60,output=120", num_requests=10, rate=100.0,
                       max_num_batched_tokens=512)
    result = simulate_checked(cfg)  # raises VerificationError on any mismatch after swap-in / recompute
    steps, requests, summary = result.steps, result.requests, result.summary
    assert summary["num_preemptions"] > 0
    assert requests["num_preemptions"].sum() == summary["num_preemptions"]
    assert list(requests["status"].unique()) == ["finished"]
    assert (steps[list(C.SLOT_COLUMNS)].sum(axis=1) == summary["kv_slots"]).all()
    assert summary["verify_max_rel_err"] <= 1e-5
    if mode == "swap":
        assert steps["swapped_blocks"].sum() > 0
    else:
        assert steps["swapped_blocks"].sum() == 0


@pytest.mark.parametrize("strategy", PAGED)
def test_a_swap_out_in_a_step_that_runs_nothing_is_made(strategy):
    """Three blocks of 8 slots. A (two samples of a 5-token prompt) and B (one sequence) decode until all three
    cross into their ninth token: A's samples need a block each and B one, with none free. B, the latest, is
    swapped out, which frees one block; A alone still needs two, so A is rejected as outgrowing the pool. The
    step computes nothing, but B's swap-out must still copy its block to the host: B is swapped back in and
    decodes, and the kernel reads the KV it had. The next step's row counts the preemption and the swap-out
    (and its duration pays the transfer), so the step table adds up to what the requests went through."""
    cfg = small_config(strategy=strategy, preemption="swap", swap_gib=0.001, kv_slots=24, num_requests=2,
                       kv_dtype="fp32", model="custom:layers=2,kv_heads=2,heads=4,head_dim=16,params_b=0.1,"
                       "max_model_len=24")
    requests = [Request(0, 0.0, 5, 12, (Segment(1000, 5),), n=2), Request(1, 0.0, 5, 12, (Segment(1001, 5),))]
    result = simulate(cfg, requests, checked_strategy(cfg))  # raises VerificationError if B's KV was lost
    assert result.requests["status"].tolist() == [f"rejected: {reasons.OUTGROWS_POOL}", "finished"]
    assert result.requests["num_preemptions"].tolist() == [0, 1]
    steps = result.steps
    assert steps["preemptions"].tolist().count(1) == 1 and steps["preemptions"].sum() == 1
    # B comes back (it decodes from the next step on), with its swap-out carried from the step before
    (swap_in,) = steps.index[steps["swapped_blocks"] > 0]
    assert steps.loc[swap_in, ["preemptions", "swapped_blocks", "num_running"]].tolist() == [1, 2, 0]
    assert result.summary["num_preemptions"] == 1
    assert 0 <= result.summary["verify_max_rel_err"] <= 1e-5


@pytest.mark.parametrize("strategy", PAGED)
def test_beams_recomputed_beyond_the_whole_pool_are_rejected(strategy):
    """Two beams shared what they generated until their group was preempted by recompute; readmitted, each holds
    its own copy of it, which the 512-slot pool cannot hold even when empty (request 16: prompt 101, 302 tokens
    out). The group is held to the upper bound of its blocks in the empty pool too and rejected as outgrowing it;
    admitted on the word that an empty pool has room, its appends ran out of blocks half way."""
    cfg = small_config(strategy=strategy, block_size=1, kv_slots=512, beam_width=2, preemption="recompute",
                       workload="sharegpt-like", kernel="none", seed=1, schedule="lof", num_requests=24,
                       watermark_frac=0.0)
    requests = simulate_checked(cfg).requests
    ended = requests[requests["status"] != "finished"]
    assert ended["status"].tolist() == [rejected_status(reasons.OUTGROWS_POOL)]
    (one,) = ended.itertuples()
    assert one.num_preemptions > 0  # it ran before it was preempted
    assert one.prompt_tokens + 2 * one.output_tokens > cfg.kv_slots


@pytest.mark.parametrize("strategy", CONTIGUOUS)
def test_contiguous_strategies_never_preempt(strategy):
    # they reserve the final length at admission, so a decode append always has its slot (and they cannot swap)
    cfg = small_config(strategy=strategy, kv_slots=384, max_model_len=256, preemption="swap",
                       swap_gib=1 / 1024, workload="fixed:prompt=60,output=120", num_requests=6, rate=100.0,
                       max_num_batched_tokens=512)
    result = simulate_checked(cfg)
    assert result.summary["num_finished"] == 6
    assert result.summary["num_preemptions"] == 0
