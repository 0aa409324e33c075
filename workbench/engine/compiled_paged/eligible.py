"""Which runs the compiled loop serves: exactly the plain `paged` case (workbench.engine.compiled_paged)."""

from __future__ import annotations

from workbench.allocators.paged.strategy import PagedStrategy
from workbench.clock.roofline import RooflineClock
from workbench.workload.request import RequestColumns

# False: every run takes the general loop (tests compare the two)
ENABLED = True


def applies(replica) -> bool:
    """Pure. Whether `replica` (a workbench.engine.replica.Replica, not imported: the loop sits below it in
    the import graph), not stepped yet, runs the plain case: a fresh `paged` strategy without prefix
    cache or tiers, no kernel runner and a modeled clock, no step timers, whole prefills, FCFS admission,
    recompute preemption, no sliding-window layers, no shipped prompts, one sequence per request."""
    sched = replica.scheduler
    cfg = sched.config
    strategy = sched.strategy
    return (ENABLED
            and type(strategy) is PagedStrategy and strategy.prefix is None and strategy.host_tier is None
            and strategy.shared_tier is None and strategy.snapshot().num_free_blocks == strategy.num_blocks
            and type(replica.clock) is RooflineClock and replica.runner is None and not replica.measured
            and replica.timers is None and replica.num_steps == 0 and replica.now_s == 0.0
            and not replica.steps.num_rows and not replica.steps.group_columns
            and not cfg.chunked_prefill and cfg.admission == "fcfs" and not sched.swap
            and cfg.kernel_every is None and not cfg.attention_windows and not sched.needs_token_ids
            and not sched.transferred and sched.step == 0 and sched.next_arrival == 0 and not sched.live
            and _one_sequence_each(sched.requests))


def _one_sequence_each(requests) -> bool:
    if isinstance(requests, RequestColumns):
        return requests.n == 1 and requests.beam_width == 1
    return all(r.n == 1 and r.beam_width == 1 for r in requests)
