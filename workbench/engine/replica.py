"""One serving replica that is stepped from outside: its scheduler, kernel runner, clock and step log.

`next_event_s()` says when the replica next has something to do (now while it has work, else its
next arrival; None once everything is done) and `step()` does it: the arrivals up to then join the
queue, the scheduler plans and allocates one step, the kernel runner (if any) executes the plan, the
clock advances by the step's modeled (or measured) time and one step row is recorded. A run drives
one replica until `next_event_s()` is None (workbench.engine.simulation); several replicas can be driven by one
event loop, each advanced when its next event is the earliest.
"""

from __future__ import annotations

import math
import time

from workbench.allocators.values import GROUP_PARTS
from workbench.clock.roofline import RooflineClock
from workbench.engine import reasons, rules
from workbench.engine.plan import StepPlan
from workbench.engine.scheduler import Scheduler
from workbench.results import StepLog
from workbench.table_sink import TableSink


class StepTimers:
    """Wall-time accumulators per engine phase (benchmarks: `simulate(..., timers=StepTimers())`).

    Whoever wraps the strategy to time its calls adds them to `allocator_s`; the phases then
    exclude that time, so the four parts add up to the step loop's time."""

    def __init__(self) -> None:
        self.allocator_s = 0.0  # inside strategy calls, in any phase
        self.scheduler_s = 0.0  # queueing and admission decisions
        self.kernel_s = 0.0  # block moves, cache writes, attention, verification
        self.bookkeeping_s = 0.0  # clock, completion, step rows
        self.steps = 0


class Replica:
    """Mutates its scheduler, the runner's pool and its step log."""

    def __init__(self, scheduler: Scheduler, runner, clock: RooflineClock, *, measured: bool, attention_scale: float,
                 timers: StepTimers | None = None, sink: TableSink | None = None) -> None:
        """`runner`: a KernelRunner or None (no kernels); `measured`: the clock takes the measured attention
        time, scaled by `attention_scale` (one layer's kernel heads -> the whole model); `sink`: where the step
        rows go (None: kept in memory)."""
        self.scheduler = scheduler
        self.runner = runner
        self.clock = clock
        self.measured = measured
        self.attention_scale = attention_scale
        self.timers = timers
        self.steps = StepLog(sink)
        self.now_s = 0.0
        self.num_steps = 0  # steps recorded
        # its waiting work found no room while finished requests held blocks that a link is still reading: no
        # step can run before one of them is released (`release`) or another request arrives
        self.blocked = False
        # preemptions and swapped-out blocks of planned steps that did not run (nothing computed): the next step
        # that runs counts them in its row and pays the swap-outs' transfer
        self.carried_preemptions = 0
        self.carried_swapped_blocks = 0

    def close(self) -> None:
        """Mutates. Give the kernel pool's memory back now (a GPU run's virtual memory), not at process exit."""
        if self.runner is not None:
            self.runner.pool.close()

    def next_event_s(self) -> float | None:
        """Pure. When the next step can start: now while there is work, else at the next arrival; None
        when no request is left."""
        sched = self.scheduler
        ready = sched.has_work() and not self.blocked
        nxt = math.inf if ready else sched.arrivals.next_arrival_s()  # the rule reads it only when not ready
        return None if nxt is None else rules.next_event_s(self.now_s, ready, nxt)

    def release(self, index: int, now_s: float) -> None:
        """Mutates. At `now_s` (no earlier than the replica's last event) a link has read the KV of the finished
        request `index`: its blocks come free, and a replica blocked for want of them can step again from then."""
        self.scheduler.device.release(index)
        if self.blocked:
            self.blocked = False
            self.now_s = max(self.now_s, now_s)

    def step(self, at_s: float | None = None) -> int:
        """Mutates. Advance to the next event and run one step there; returns the groups it finished.
        `at_s`: that event's time as `next_event_s()` just gave it (None: read it here). Raises RuntimeError
        when work is left that can never run."""
        sched, timers = self.scheduler, self.timers
        nxt = self.next_event_s() if at_s is None else at_s
        if nxt is None:
            raise RuntimeError("the replica has no work left")
        self.now_s = nxt
        self.blocked = False
        sched.arrive(self.now_s)
        if not sched.has_work():  # every request that arrived now was rejected on arrival
            return 0
        if timers:
            perf = time.perf_counter
            a0, t0 = timers.allocator_s, perf()
        rejected = sched.log.num_rejected
        plan = sched.schedule(self.now_s)
        verdict = rules.step_verdict(plan.cost.num_running, len(plan.started), sched.log.num_rejected - rejected)
        if verdict != rules.RUN:
            if self.runner is not None:  # a preemption's swap-out and the tier moves happen all the same
                self.runner.move(plan)
            self.carried_preemptions += plan.preemptions
            self.carried_swapped_blocks += plan.cost.swapped_blocks
            if verdict == rules.STUCK and sched.device.held_seqs:  # held blocks will come free: wait for them
                self.blocked = True
                return 0
            if verdict == rules.STUCK:
                raise RuntimeError(reasons.stuck(self.now_s, len(sched.waiting), len(sched.device.swapped)))
            return 0
        if self.carried_preemptions:
            plan = self._with_carried(plan)
        if timers:
            a1, t1 = timers.allocator_s, perf()
        attention_s = self.runner.run(plan) if self.runner is not None else None
        if timers:
            a2, t2 = timers.allocator_s, perf()
        measured_s = attention_s * self.attention_scale if self.measured and attention_s is not None else None
        dt_s = self.clock.cost_s(plan.cost, measured_s)
        self.now_s += dt_s
        finished = sched.complete(plan, self.now_s)
        # the steps table stays deterministic: a wall time enters it only under the measured clock
        self._record(plan, dt_s, attention_s if self.measured else None)
        if timers:
            a3, t3 = timers.allocator_s, perf()
            timers.scheduler_s += (t1 - t0) - (a1 - a0)
            timers.kernel_s += (t2 - t1) - (a2 - a1)
            timers.bookkeeping_s += (t3 - t2) - (a3 - a2)
            timers.steps += 1
        return finished

    def _with_carried(self, plan: StepPlan) -> StepPlan:
        """Mutates the carry. The plan with the preemptions and swap-outs of the steps before it that did not run."""
        cost = plan.cost._replace(swapped_blocks=plan.cost.swapped_blocks + self.carried_swapped_blocks)
        plan = plan._replace(preemptions=plan.preemptions + self.carried_preemptions, cost=cost)
        self.carried_preemptions = self.carried_swapped_blocks = 0
        return plan

    def _record(self, plan: StepPlan, dt_s: float, attention_s: float | None) -> None:
        snap, cost, log = plan.snapshot, plan.cost, self.steps
        allocated = snap.token_slots + snap.reserved_slots + snap.internal_frag_slots
        if snap.groups:  # a pool of layer groups counts each group's blocks in its own units
            unshared = sum(g.unshared_slots for g in snap.groups)
        else:
            unshared = cost.unshared_block_slots if self.scheduler.grows_by_blocks else allocated
        # INT_STEP_COLUMNS order (workbench.results)
        log.record((self.now_s, dt_s, attention_s or 0.0), (
            self.num_steps, cost.num_running, self.scheduler.num_waiting(),
            cost.num_prefill_tokens, cost.num_decode_tokens,
            snap.token_slots, snap.reserved_slots, snap.internal_frag_slots, snap.cached_slots,
            snap.external_frag_slots, snap.free_slots, snap.logical_token_slots, snap.block_table_bytes,
            cost.copied_blocks, plan.preemptions, cost.swapped_blocks,
            snap.largest_free_extent_slots, unshared,
        ))
        if plan.effects.columns:
            log.record_groups(dict(plan.effects.columns))
        if plan.columns:
            log.record_groups(dict(plan.columns))
        if self.scheduler.strategy.state_blocks_per_seq:  # a recurrent model's states (docs/recurrent.md)
            log.record_groups({"state_slots": snap.state_slots, "state_checkpoint_slots": snap.state_checkpoint_slots})
        if snap.groups:
            log.record_groups({f"group{i}_{part}": getattr(g, part) for i, g in enumerate(snap.groups)
                               for part in GROUP_PARTS})
        self.num_steps += 1
