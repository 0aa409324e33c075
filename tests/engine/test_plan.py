"""The step plan is the whole contract: the runner never calls back into the strategy, and the plan's
counts agree with a recomputation from the sequences it carries."""

from __future__ import annotations

import pytest

from tests.conftest import strategy_workload_grid
from tests.engine.conftest import checked_strategy, small_config
from workbench.allocators.registry import names
from workbench.engine import simulate
from workbench.engine.runner import KernelRunner
from workbench.intmath import cdiv
from workbench.workload import build_workload

WORKLOADS = {
    "parallel-n3": dict(workload="alpaca-like", n=3, num_requests=8),
    "beam3": dict(workload="alpaca-like", beam_width=3, num_requests=5),
    "tight-pool-swap": dict(workload="sharegpt-like", num_requests=12, rate=20.0, kv_slots=1024,
                            preemption="swap", swap_gib=0.0005, kv_dtype="fp16"),
}


def _observed_run(cfg, check_plan):
    """Simulate `cfg`; every strategy call made while the runner executes a plan is recorded, and
    `check_plan(plan)` sees every plan."""
    strategy = checked_strategy(cfg)
    calls: list[str] = []
    inside = [False]
    base = type(strategy)

    def recorder(name):
        method = getattr(base, name)

        def call(self, *args, **kwargs):
            if inside[0]:
                calls.append(name)
            return method(self, *args, **kwargs)
        return call

    public = [n for n in dir(base) if not n.startswith("_") and callable(getattr(base, n))]
    strategy.__class__ = type("Recorded", (base,), {n: recorder(n) for n in public})
    run = KernelRunner.run

    def observed(runner, plan):
        check_plan(plan)
        inside[0] = True
        try:
            return run(runner, plan)
        finally:
            inside[0] = False

    KernelRunner.run = observed
    try:
        result = simulate(cfg, build_workload(cfg), strategy)
    finally:
        KernelRunner.run = run
    return result, calls


@pytest.mark.parametrize(("strategy", "workload"), strategy_workload_grid(names(), sorted(WORKLOADS), per_strategy=1))
def test_the_runner_reads_only_the_plan(strategy, workload):
    cfg = small_config(strategy=strategy, **WORKLOADS[workload])
    plans = []
    result, calls = _observed_run(cfg, plans.append)
    assert result.summary["num_finished"] == cfg.num_requests
    assert calls == [], f"the runner called the strategy: {sorted(set(calls))}"
    assert plans and all(p.kernel is not None for p in plans)
    with pytest.raises(AttributeError):
        plans[0].step = 1


@pytest.mark.parametrize(("strategy", "workload"), strategy_workload_grid(names(), sorted(WORKLOADS), per_strategy=1))
def test_step_cost_equals_a_recomputation_from_the_plan(strategy, workload):
    """The cost meter keeps decode totals in O(1) per step; recompute them from each sequence's length."""
    cfg = small_config(strategy=strategy, kernel_every=1, **WORKLOADS[workload])
    bs = checked_strategy(cfg).block_size
    seen = []

    def check(plan):
        k, cost = plan.kernel, plan.cost
        decode_len = k.decode_positions + 1  # [num_decode] KV rows each decoding sequence attends to
        assert cost.num_decode_tokens == len(k.decode_seq_ids) == len(k.groups[0].decode_slots)
        prefill_read = sum(p.stop * p.num_seqs for p in plan.prefills)
        assert cost.kv_read_tokens == int(decode_len.sum()) + prefill_read
        prefill_ctx = sum((p.stop * (p.stop + 1) - p.start * (p.start + 1)) // 2 for p in plan.prefills)
        assert cost.attn_query_ctx == int(decode_len.sum()) + prefill_ctx
        assert cost.num_prefill_tokens == sum(p.write_tokens for p in plan.prefills)
        # the blocks the decode kernel visits (the clock's per-block attention cost)
        assert cost.decode_blocks == sum(cdiv(int(n), bs) for n in decode_len)
        if k.groups[0].decode_desc is not None:
            unshared = sum(cdiv(int(n), bs) * bs for n in decode_len)
            unshared += sum(p.num_seqs * cdiv(p.stop, bs) * bs for p in plan.prefills)
            unshared += sum(g.num_seqs * cdiv(g.kv_len, bs) * bs for g in plan.started)
            assert cost.unshared_block_slots == unshared
        assert cost.copied_blocks == len(plan.copies)
        assert cost.swapped_blocks == len(plan.swap_out) + len(plan.swap_in)
        seen.append(plan.step)

    _observed_run(cfg, check)
    assert seen == list(range(len(seen))) and len(seen) > 10
