"""virtual-contiguous in the engine: extents bound the batch, pages bound memory, mapping costs time."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.conftest import checked_strategy, simulate_checked, small_config
from workbench import columns as C
from workbench.engine import simulate
from workbench.engine.admission import Admission
from workbench.engine.beam_forks import BeamForks
from workbench.engine.runner import KernelRunner
from workbench.workload import build_workload

# 4 KiB pages hold 32 tokens of the small model's 128-byte fp32 rows
VC = dict(strategy="virtual-contiguous", page_kib=4)


def test_max_batch_exhausted_makes_requests_wait_and_loses_none():
    cfg = small_config(**VC, max_batch=2, workload="alpaca-like", num_requests=12, rate=100.0)
    result = simulate_checked(cfg)
    summary, requests = result.summary, result.requests
    assert summary["max_batch_size"] == 2  # pages were plenty: the extents set the batch
    assert (result.steps["num_waiting"] > 0).any()
    assert list(requests["status"].unique()) == ["finished"] and summary["num_finished"] == 12
    assert 0 <= summary["verify_max_rel_err"] <= 1e-5


@pytest.mark.parametrize("fail", [False, True])
def test_the_engine_closes_the_pool_when_a_run_ends_or_fails(monkeypatch, fail):
    """Every run in one process would otherwise keep its pages and address range until exit."""
    from workbench.engine.kvpool_vmm import VirtualKVPool

    closed, real_close, real_run = [], VirtualKVPool.close, KernelRunner.run

    def close(pool):
        closed.append(pool)
        real_close(pool)

    def run(runner, plan):
        if fail and plan.step == 3:
            raise RuntimeError("a kernel failed")
        return real_run(runner, plan)

    monkeypatch.setattr(VirtualKVPool, "close", close)
    monkeypatch.setattr(KernelRunner, "run", run)
    cfg = small_config(**VC, workload="fixed:prompt=40,output=8", num_requests=3, rate=100.0)
    if fail:
        with pytest.raises(RuntimeError, match="a kernel failed"):
            simulate_checked(cfg)
    else:
        simulate_checked(cfg)
    assert len(closed) == 1 and closed[0].vmm.closed


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_tiny_pool_preempts_and_still_verifies(mode):
    # 512 slots are 16 pages of 32 tokens; each request grows to 6 pages
    cfg = small_config(**VC, kv_slots=512, max_model_len=256, preemption=mode, swap_gib=1 / 1024,
                       workload="fixed:prompt=60,output=120", num_requests=10, rate=100.0, max_num_batched_tokens=512)
    result = simulate_checked(cfg)
    steps, summary = result.steps, result.summary
    assert summary["num_preemptions"] > 0 and summary["num_finished"] == 10
    assert (steps[list(C.SLOT_COLUMNS)].sum(axis=1) == summary["kv_slots"]).all()
    assert (steps["swapped_blocks"].sum() > 0) == (mode == "swap")
    assert summary["verify_max_rel_err"] <= 1e-5


def test_a_readmission_undone_for_want_of_pages_copies_nothing(monkeypatch):
    """Two samples readmitted after a recompute preemption take their extents and the prompt's copies, then
    their own generated tokens need pages the pool lacks: the admission is undone. Its copies must go with it:
    their destination slots may be the next admitted group's in the same step (the kernel refuses two copies
    into one slot, and a copy would overwrite that group's prompt)."""
    undone = []
    place = Admission._place_whole

    def recorded(self, g, *args):
        freed = []
        free = self.strategy.free
        monkeypatch.setattr(self.strategy, "free", lambda seq_id: (freed.append(seq_id), free(seq_id))[1])
        try:
            return place(self, g, *args)
        finally:
            monkeypatch.delattr(self.strategy, "free")
            if freed:
                undone.append(g.index)

    monkeypatch.setattr(Admission, "_place_whole", recorded)
    cfg = small_config(strategy="virtual-contiguous", block_size=1, kv_slots=512, preemption="recompute", n=2,
                       admission="skip", workload="alpaca-like", seed=0, num_requests=15, rate=50.0)
    result = simulate_checked(cfg)  # the kernels verified at every step
    assert undone
    assert result.summary["verify_max_rel_err"] <= 1e-5


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_a_beam_group_preempted_in_the_step_it_forked_keeps_its_kv(mode, monkeypatch):
    """A fork copies the parent's slots into the child's extent; the group is then preempted in the same step.
    Swapped out, the child's host copy must hold the parent's KV (the runner reads the swap-out before it would
    make the fork's copies); either way no copy may write into the extents it released."""
    withdrawn = []
    withdraw = BeamForks.withdraw

    def recorded(self, seq_ids, swap_out):
        forks, copies = self._taken
        withdrawn.extend(child for k, (_, child) in enumerate(forks) if child in seq_ids and len(copies[k]))
        return withdraw(self, seq_ids, swap_out)

    monkeypatch.setattr(BeamForks, "withdraw", recorded)
    cfg = small_config(strategy="virtual-contiguous", block_size=1, kv_slots=512, preemption=mode, beam_width=2,
                       swap_gib=1 / 4096, workload="alpaca-like", seed=0, num_requests=15, rate=50.0)
    strategy = checked_strategy(cfg)
    compare_mapped_pages_after_each_step(monkeypatch, strategy)
    result = simulate(cfg, build_workload(cfg), strategy)  # the kernels verified at every step
    assert withdrawn
    assert result.summary["verify_max_rel_err"] <= 1e-5


def test_mapping_pages_costs_time_unless_overlapped():
    def sim_time(**options) -> float:
        return simulate_checked(small_config(**VC, kernel="none", **options)).summary["sim_time_s"]

    free = sim_time(map_us_per_page=0.0)
    serial = sim_time(map_us_per_page=500.0)
    overlapped = sim_time(map_us_per_page=500.0, overlap_map="on")
    assert free < overlapped < serial


def test_the_reuse_cache_shows_as_cached_slots():
    result = simulate_checked(small_config(**VC, page_reuse="on", kernel="none", num_requests=30))
    steps = result.steps
    assert (steps["cached_slots"] > 0).any() and (steps["external_frag_slots"] == 0).all()
    assert result.summary["mem_cached_frac"] > 0


@pytest.mark.parametrize("page_reuse", ["off", "on"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_the_pools_mapped_pages_are_the_strategys_after_every_step(monkeypatch, page_reuse, mode):
    # the tiny pool of the preemption test: pages are released by finishing, preempted and swapped
    # requests and, with reuse on, reclaimed from released extents when free pages run out
    cfg = small_config(**VC, kv_slots=512, max_model_len=256, preemption=mode, swap_gib=1 / 1024,
                       page_reuse=page_reuse, workload="fixed:prompt=60,output=120", num_requests=10, rate=100.0,
                       max_num_batched_tokens=512)
    strategy = checked_strategy(cfg)
    released = compare_mapped_pages_after_each_step(monkeypatch, strategy)
    result = simulate(cfg, build_workload(cfg), strategy)
    assert result.summary["num_finished"] == 10 and result.summary["num_preemptions"] > 0
    assert sum(released) > 0 and result.summary["verify_max_rel_err"] <= 1e-5


def compare_mapped_pages_after_each_step(monkeypatch, strategy) -> list[int]:
    """After every step the kernel runner runs, the KV pool's mapped pages must be the strategy's. Returns the list
    the slots each step's plan released are appended to."""
    released = []
    run = KernelRunner.run

    def run_then_compare(runner, plan):
        attention_s = run(runner, plan)
        np.testing.assert_array_equal(runner.pool.vmm.mapped_pages(), strategy.mapped_virtual_pages(),
                                      err_msg=f"step {plan.step}")
        released.append(int((plan.effects.unmapped[:, 1] - plan.effects.unmapped[:, 0]).sum()))
        return attention_s

    monkeypatch.setattr(KernelRunner, "run", run_then_compare)
    return released

