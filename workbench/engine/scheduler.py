"""Continuous (or static) batching over one allocation strategy (docs/engine.md): which groups run each step.

A request becomes a *group* of sequences sharing its prompt (n parallel samples or beam_width
beams; workbench.engine.groups).

Per step (`schedule`): running groups get one slot per sequence (preempting the latest-arrived
group, all or nothing, while that is impossible), then — only if nothing was preempted — swapped
groups come back and waiting groups are admitted (workbench.engine.admission), in arrival order or the
order of `--schedule` (workbench.engine.admission_order). With chunked prefill the
budget covers decodes and prefill chunks alike, and a partially prefilled group (a running one) continues
first, in a step that preempted too (workbench.engine.prefill_chunks). The result is a `StepPlan` of plain
data (workbench.engine.plan); `complete` then advances the tokens and retires finished groups. Only the
strategy's integers change here; the kernel runner executes the plan's copies, moves and writes on
the KV pool.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.base import Strategy
from workbench.allocators.values import NO_PAIRS
from workbench.clock.step_cost import CostMeter
from workbench.engine import reasons, rules
from workbench.engine.admission import Admission
from workbench.engine.admission_order import admission_order
from workbench.engine.arrivals import Arrivals
from workbench.engine.beam_forks import BeamForks
from workbench.engine.decode_batch import DecodeBatch
from workbench.engine.groups import Group, GroupState
from workbench.engine.kernel_inputs import kernel_inputs
from workbench.engine.plan import NOTHING_ADMITTED, Admitted, GrownBatch, Prefill, Resumed, StepPlan, concat_pairs
from workbench.engine.prefill_chunks import PrefillChunks
from workbench.engine.request_log import RequestLog
from workbench.engine.residency import Residency
from workbench.engine.scheduler_config import SchedulerConfig
from workbench.engine.tokens import TokenStore
from workbench.engine.verify_steps import VerifySteps
from workbench.workload.request import Request, any_beam_search


class Scheduler:
    """Owns the queues; mutates the strategy, the token store and the request log it is given."""

    # a step with nothing but the decode batch to run takes `_decode_only`, the general path's calls without
    # its empty admission work (False: every step takes the general path; tests compare the two)
    lean_decode_steps = True

    def __init__(self, strategy: Strategy, requests: list[Request], tokens: TokenStore, config: SchedulerConfig
                 ) -> None:
        self.strategy = strategy
        self.arrivals = Arrivals(requests)
        self.tokens = tokens
        self.config = config
        self.log = RequestLog(len(requests), speculative=config.spec_tokens > 0)
        self.grows_by_blocks = strategy.grows_by_blocks
        self.block_size = strategy.block_size
        self.static_batching = config.batching == "static"  # rules.admits_now
        self.chunks = PrefillChunks(strategy, tokens) if config.chunked_prefill else None
        num_blocks = strategy.capacity_slots // self.block_size
        watermark = int(config.watermark_frac * num_blocks) if self.grows_by_blocks else 0
        self.live: dict[int, Group] = {}  # request index -> its group, from arrival until done
        self.admission = Admission(strategy, tokens, self.log, None if self.chunks is None else self.chunks.admit,
                                   self.live, max_num_seqs=config.max_num_seqs, watermark_blocks=watermark,
                                   skip_unplaced=config.admission == "skip")
        self.order = admission_order(strategy, tokens, config)  # None: arrival order (fcfs)
        self.batch = DecodeBatch(CostMeter(self.block_size, config.attention_windows))
        # groups on the device, swapped out and held (workbench.engine.residency)
        self.device = Residency(strategy, self.log, self.waiting, leave_batch=self.batch.leave,
                                reject=self.admission.reject, drop_partial=self._drop_partial,
                                swap=config.swap and strategy.supports_swap, max_num_seqs=config.max_num_seqs)
        self.step = 0  # completed steps
        self.finish_at: dict[int, list[tuple[Group, int]]] = {}  # step -> (group, epoch) finishing then
        self.beams = BeamForks(strategy, tokens, config.seed, self.admission.new_seq_id, config.beam_branch_frac)
        self.has_beams = any_beam_search(requests)
        # token ids of the decode batch are computed when the strategy caches decode-filled blocks or a
        # kernel writes them
        self.needs_token_ids = strategy.wants_token_ids or config.kernel_every is not None
        # speculative decoding (docs/speculative.md); None: off
        self.spec = VerifySteps(strategy, tokens, self.log, self.batch, config) if config.spec_tokens else None

    # ---- queue state -------------------------------------------------------------------------
    @property
    def waiting(self):
        return self.admission.waiting

    def arrive(self, now_s: float) -> None:
        """Mutates. Requests that arrived by `now_s` join the waiting queue (or are rejected)."""
        self.admission.arrive(self.arrivals.arrived(now_s), self.config.max_model_len)

    def add_request(self, request: Request, *, transferred: bool = False, holds_kv: bool = False) -> None:
        """Mutates. One more request, arriving no earlier than those given (a fleet's router hands each replica
        its requests as they arrive). `transferred`: its prompt's KV and first token come from a prefill replica
        (docs/fleet.md). `holds_kv`: its blocks stay after it finishes, until `release` (a link reads them)."""
        self.arrivals.add(request, transferred=transferred, holds_kv=holds_kv)
        self.log.grow(1)
        self.has_beams = self.has_beams or request.beam_width > 1

    def has_work(self) -> bool:
        # the batch's groups, not the batch: called thrice a step, and `DecodeBatch.__bool__` is a call
        return bool(self.batch.groups or self.waiting or self.device.swapped or self._partial())

    def _partial(self) -> Group | None:  # the partially prefilled group (chunked prefill only)
        return None if self.chunks is None else self.chunks.group

    def _drop_partial(self) -> None:
        self.chunks.group = None

    def num_waiting(self) -> int:  # waiting and swapped out
        return len(self.waiting) + len(self.device.swapped)

    def outstanding(self) -> int:
        """Requests given and not yet finished or rejected."""
        return len(self.arrivals.requests) - self.log.num_finished - self.log.num_rejected

    def queued_prefill_tokens(self) -> int:
        """Prompt tokens still to compute: of the requests not arrived, waiting (with what a recompute adds)
        and the rest of a partial prefill."""
        waiting = sum(rules.recompute_tokens(g.request.prompt_tokens, g.generated) for g in self.waiting)
        partial = self._partial()
        return (self.arrivals.not_arrived_prompt_tokens() + waiting
                + (partial.request.prompt_tokens - partial.kv_len if partial else 0))

    # ---- one step ----------------------------------------------------------------------------
    def schedule(self, now_s: float) -> StepPlan:
        """Mutates the strategy and the queues: decide and allocate this step's work."""
        if self.lean_decode_steps and not (self.waiting or self.device.swapped or self.has_beams or self._partial()) \
                and self.batch.groups and self.spec is None:
            plan = self._decode_only()
            if plan is not None:
                return plan
        forks, copies = self.beams.take() if self.has_beams else ((), [])
        swap_out: list[np.ndarray] = []
        grown = self._grow_batch(swap_out)
        if grown.appended is not None and len(grown.appended.copies):
            copies.append(grown.appended.copies)
        decode_tokens = len(grown.ids) if self.spec is None else self.spec.decode_tokens(len(grown.ids))
        budget = self.config.max_num_batched_tokens - (decode_tokens if self.chunks is not None else 0)
        admitted = Admitted()
        self._admit(now_s, budget, copies, admitted, grown.preemptions)
        return self._plan(grown.ids, admitted, concat_pairs(copies), concat_pairs(swap_out), grown.preemptions,
                          tuple(forks), grown)

    def _decode_only(self) -> StepPlan | None:
        """The plan of a step whose work is the decode batch alone (nothing waits, is swapped out or part-prefilled, no
        beam forks): `schedule`'s strategy calls, in order; None, with nothing changed, when the batch does not fit."""
        grown = GrownBatch(self.batch.ids())
        if not self._append(grown):
            return None
        copies = grown.appended.copies if len(grown.appended.copies) else NO_PAIRS
        return self._plan(grown.ids, NOTHING_ADMITTED, copies, NO_PAIRS, 0, (), grown)

    def _append(self, grown: GrownBatch) -> bool:
        """Mutates on success. Each sequence of `grown.ids` gets its next slot (and its position and token where
        they are read), all or nothing; False, with nothing allocated, when the pool cannot supply them."""
        strategy, batch = self.strategy, self.batch
        if self.needs_token_ids:
            grown.seq_ids, grown.positions, generated = batch.positions(grown.ids, self.step)
            grown.token_ids = self.tokens.generated(grown.seq_ids, generated)
        token_ids = grown.token_ids if strategy.wants_token_ids else None
        grown.appended = (strategy.append_if_room(grown.ids, token_ids) if self.spec is None
                          else self.spec.append(grown.ids, token_ids))
        if grown.appended is None:
            return False
        batch.meter.decoded(len(grown.ids), self.step)
        return True

    def _grow_batch(self, swap_out: list[np.ndarray]) -> GrownBatch:
        """Mutates. Every decoding sequence gets one slot, all or nothing: while the pool cannot supply them the latest
        holder is preempted (swapped out into `swap_out`, or freed for recompute), or rejected if the only one."""
        batch = self.batch
        grown = GrownBatch(batch.ids())
        while grown.ids:
            if self._append(grown):
                return grown
            partial = self._partial()
            holders = batch.groups if partial is None else [*batch.groups, partial]
            victim = holders[rules.victim(np.array([g.index for g in holders], dtype=np.int64))]
            if rules.retires_victim(len(holders)):
                self.device.retire(victim, reasons.OUTGROWS_POOL, self.step)
            else:
                self.device.preempt(victim, swap_out, self.step)
                grown.preemptions += 1
            if self.has_beams:  # a victim that forked this step: its forks' copies are not made
                self.beams.withdraw(victim.seq_ids, swap_out if victim.state == GroupState.SWAPPED else None)
            grown.ids = batch.ids()
        return GrownBatch(grown.ids, preemptions=grown.preemptions)  # nobody decodes: no positions, no tokens

    def spec_counters(self) -> dict[str, int | float]:
        """Speculative decoding's summary counters and rates (empty when it is off)."""
        return {} if self.spec is None else self.spec.counters()

    def _admit(self, now_s: float, budget: int, copies: list[np.ndarray], admitted: Admitted, preemptions: int) -> None:
        """Mutates. The partial prefill continues (it is running); then, unless the step preempted, swapped groups
        come back, then (with neither left) waiting groups are admitted under the budget; static: an empty batch."""
        if not rules.admits_now(self.static_batching, len(self.batch.groups)):
            return
        if self._partial() is not None:
            budget = self._continue_prefill(admitted.prefills, copies, budget)
        if not rules.admits_after(preemptions):
            return
        swap_in: list[np.ndarray] = []
        self.device.swap_in(admitted.started, swap_in)
        admitted.swap_in = concat_pairs(swap_in)
        if not self.device.swapped and self._partial() is None:
            if self.order is not None:
                self.order.arrange(self.waiting, self.step)
            device = self.device
            admitted.refused_extent, device.num_running_seqs = self.admission.admit(
                now_s, device.num_running_seqs, device.held_seqs, admitted.prefills, copies, budget, admitted.landed)
            # a shipped prompt holds its blocks from now and decodes from the next step, as a swap-in
            admitted.started += [Resumed(t.request_index, 1, t.kv_len) for t in admitted.landed]

    def _plan(self, ids: list[int], admitted: Admitted, copies: np.ndarray, swap_out: np.ndarray, preemptions: int,
              forks: tuple, grown: GrownBatch | None) -> StepPlan:
        """The step's plan once its allocations are made: the strategy's step effects, the cost, the kernel's
        inputs (a step with a kernel) and the snapshot."""
        strategy = self.strategy
        effects = strategy.end_step()
        holding = admitted.started if self.chunks is None else [*admitted.started, *self.chunks.idle(admitted.prefills)]
        cost = self.batch.meter.cost(len(ids), admitted.prefills, holding, len(copies),
                                     len(swap_out) + len(admitted.swap_in), effects.mapped_pages)
        if len(effects.promote) or len(effects.shared_promote):
            cost = cost._replace(loaded_blocks=len(effects.promote), shared_loaded_blocks=len(effects.shared_promote))
        if effects.state_copies:
            cost = cost._replace(state_copies=effects.state_copies)
        every = self.config.kernel_every
        kernel = None if every is None else kernel_inputs(
            strategy, self.step % every == 0, ids, grown.seq_ids, grown.positions, grown.token_ids, admitted.prefills,
            grown.appended, admitted.landed, None if self.spec is None else self.spec.verify)
        refused = admitted.refused_extent
        spec = self.spec
        cost, columns = (cost, ()) if spec is None else spec.step_parts(cost, self.block_size, grown is not None)
        return StepPlan(self.step, self.batch.requests(), tuple(admitted.started), tuple(admitted.prefills), swap_out,
                        admitted.swap_in, copies, forks, preemptions, refused, strategy.snapshot(refused), cost, kernel,
                        effects, tuple(admitted.landed), columns)

    def complete(self, plan: StepPlan, now_s: float) -> int:
        """Mutates. The step ended at `now_s`: every scheduled sequence produced one token and finished
        groups are freed. Returns how many groups finished."""
        self.step += 1
        step, live = self.step, self.live
        if self.spec is not None:
            self.spec.settle(step)
        if self.has_beams:
            for i in plan.decode_requests:
                g = live[i]
                if g.request.beam_width > 1:
                    self.batch.sync(g, step)
                    self._advance_beams(g)
        for p in plan.prefills:
            if not p.completes:  # a chunk before the last: the group stays PREFILLING
                continue
            g = live[p.request_index]
            g.generated += 1
            self.log.first_token(g.index, now_s)
            if g.request.beam_width > 1:
                self._advance_beams(g)
            self._start_decoding(g)
        for r in plan.started:
            self._start_decoding(live[r.request_index])
        finished = 0
        for g, epoch in self.finish_at.pop(step, ()):
            if g.epoch != epoch:
                continue
            self.device.finish(g, step)
            for seq_id in g.seq_ids:
                self.tokens.remove(seq_id)
            g.state = GroupState.DONE
            del live[g.index]
            self.log.finished(g.index, now_s, g.request.output_tokens * g.num_seqs)
            finished += 1
        return finished

    def _advance_beams(self, g: Group) -> None:
        if self.beams.advance(g) and g.state == GroupState.RUNNING:
            self.batch.reshaped()

    def _start_decoding(self, g: Group) -> None:
        """A STARTING group joins the decode batch; it finishes after (output - generated) more steps."""
        left = rules.tokens_left(g.request.output_tokens, g.generated)
        g.synced_step = self.step
        steps = left if self.spec is None or not left else self.spec.steps_to_finish(g)
        self.finish_at.setdefault(self.step + steps, []).append((g, g.epoch))
        if left:  # a group with nothing left stays STARTING and finishes in this `complete`
            self.batch.join(g, self.step)

    # ---- admission of what was already admitted once -----------------------------------------
    def _continue_prefill(self, prefills: list[Prefill], copies: list[np.ndarray], budget: int) -> int:
        """The partially prefilled group computes its next chunk; returns the budget left. Without room it waits
        for running (or held) groups to free blocks; with none, no block will ever come free and it is rejected."""
        prefill = self.chunks.advance(budget, copies)
        if prefill is not None:
            prefills.append(prefill)
            return budget - prefill.write_tokens
        if not self.batch and not self.device.held_seqs:
            g = self.chunks.group
            self._drop_partial()
            self.device.retire(g, reasons.OUTGROWS_POOL, self.step)
        return budget
