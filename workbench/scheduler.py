"""FCFS continuous batching over one allocation strategy (docs/engine.md): which groups run each step.

A request becomes a *group* of sequences sharing its prompt (n parallel samples or beam_width
beams; workbench.groups).

Per step (`schedule`): running groups get one slot per sequence (preempting the latest-arrived
group, all or nothing, while that is impossible), then — only if nothing was preempted — swapped
groups come back and waiting groups are admitted in arrival order, under `max_num_seqs`, a prefill
budget of `max_num_batched_tokens` and (paged strategies) a free-block watermark. With chunked
prefill the budget covers decodes and prefill chunks alike, and a partially prefilled group
continues before anything new is admitted (workbench.prefill_chunks). The result is a
`StepPlan` (workbench.plan); `complete` then advances the tokens and retires finished groups. Only
the strategy's integers change here; the kernel runner executes the plan's copies, moves and
writes on the KV pool.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from workbench.allocators.base import Strategy, drain_unmapped, mapped_pages, take_host_moves
from workbench.beam_forks import BeamForks
from workbench.group_admission import Refused, admit_group
from workbench.groups import Group, GroupState
from workbench.intmath import cdiv
from workbench.kernel_inputs import kernel_inputs
from workbench.plan import NO_PAIRS, NO_SLOTS, Prefill, StepPlan
from workbench.prefill_chunks import PrefillChunks
from workbench.request_log import RequestLog
from workbench.step_cost import CostMeter
from workbench.tokens import TokenStore
from workbench.workload.request import Request

MAX_PASS_KEY = 2**63  # larger than any block count or extent: nothing refused yet


class Scheduler:
    """Owns the queues; mutates the strategy, the token store and the request log it is given.

    `kernel_every`: None when no kernel consumes the plans (they then carry no kernel inputs);
    else attention runs at steps divisible by it, and those plans carry the kernels' descriptors."""

    def __init__(self, strategy: Strategy, requests: list[Request], tokens: TokenStore, *, max_model_len: int,
                 max_num_seqs: int, max_num_batched_tokens: int, watermark_frac: float, swap: bool, seed: int,
                 kernel_every: int | None = None, chunked_prefill: bool = False, admission: str = "fcfs",
                 beam_branch_frac: float = 1.0, attention_windows: tuple[tuple[int, float], ...] = ()) -> None:
        self.strategy = strategy
        self.requests = requests
        self.tokens = tokens
        self.log = RequestLog(len(requests))
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.paged = strategy.kernel_mode == "paged"
        self.block_size = strategy.block_size
        self.watermark_blocks = int(watermark_frac * (strategy.capacity_slots // self.block_size)) if self.paged else 0
        self.swap = swap and strategy.supports_swap  # else preemption recomputes
        self.kernel_every = kernel_every
        self.chunks = PrefillChunks(strategy, tokens) if chunked_prefill else None
        self.skip_unplaced = admission == "skip"  # pass over waiting groups the pool cannot place (docs/engine.md)
        self.refused_extents: dict[int, int] = {}  # (skip) group index -> the contiguous extent it was refused
        self.next_arrival = 0  # index of the first request not yet arrived
        self.waiting: deque[Group] = deque()
        self.swapped: deque[Group] = deque()
        self.running: list[Group] = []  # decoding groups, in the order they joined
        self.num_running_seqs = 0  # sequences holding device KV: RUNNING and STARTING groups
        self.next_seq_id = 0
        self.step = 0  # completed steps
        self.finish_at: dict[int, list[tuple[Group, int]]] = {}  # step -> (group, epoch) finishing then
        self.meter = CostMeter(self.block_size, attention_windows)  # (window, layer fraction): step_cost
        self.mapped_pages_seen = mapped_pages(strategy)  # pages mapped before this step (forks map between steps)
        self.beams = BeamForks(strategy, tokens, seed, self._new_seq_id, beam_branch_frac)
        self.has_beams = any(r.beam_width > 1 for r in requests)
        # Token ids of the decode batch are computed when the strategy caches decode-filled blocks or a
        # kernel writes them. A decoding sequence writes position `_pos_base + step`, generated token
        # `_pos_base + step - _prompt_len`; both arrays are rebuilt when the batch list changes.
        self.needs_token_ids = strategy.wants_token_ids or kernel_every is not None
        self._decode_ids: list[int] | None = None  # the flattened running sequences, rebuilt on change
        self._batch: list[int] | None = None  # the batch list the three arrays below describe
        self._batch_ids = NO_SLOTS  # int64 [num_decode]
        self._pos_base = NO_SLOTS  # int64 [num_decode]
        self._prompt_len = NO_SLOTS  # int64 [num_decode]

    # ---- queue state -------------------------------------------------------------------------
    def arrive(self, now_s: float) -> None:
        """Mutates. Requests that arrived by `now_s` join the waiting queue (or are rejected)."""
        reqs = self.requests
        while self.next_arrival < len(reqs) and reqs[self.next_arrival].arrival_s <= now_s:
            i = self.next_arrival
            req = reqs[i]
            self.next_arrival += 1
            group = Group(i, req, final_len=req.prompt_tokens + req.output_tokens - 1)
            total = req.prompt_tokens + req.output_tokens
            if total > self.max_model_len:
                self._reject(group, f"prompt+output ({total}) > max_model_len ({self.max_model_len})")
            else:
                self.waiting.append(group)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.swapped or self._partial())

    def _partial(self) -> Group | None:
        """The partially prefilled group (chunked prefill only)."""
        return None if self.chunks is None else self.chunks.group

    def next_arrival_s(self) -> float | None:
        if self.next_arrival < len(self.requests):
            return self.requests[self.next_arrival].arrival_s
        return None

    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.swapped)

    def decode_ids(self) -> list[int]:
        """The running sequences in batch order (cached until the running set changes)."""
        if self._decode_ids is None:
            self._decode_ids = [s for g in self.running for s in g.seq_ids]
        return self._decode_ids

    def _new_seq_id(self) -> int:
        self.next_seq_id += 1
        return self.next_seq_id - 1

    def _decode_positions(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The decode batch as int64 [num_decode] arrays: sequence ids and the position each writes."""
        if self._batch is not ids:
            running = self.running
            sizes = [g.num_seqs for g in running]
            self._batch_ids = np.asarray(ids, dtype=np.int64)
            # a running group's kv_len lags by (step - synced_step): position = kv_len - synced_step + step
            self._pos_base = np.repeat(np.array([g.kv_len - g.synced_step for g in running], dtype=np.int64), sizes)
            self._prompt_len = np.repeat(np.array([g.request.prompt_tokens for g in running], dtype=np.int64), sizes)
            self._batch = ids
        return self._batch_ids, self._pos_base + self.step

    def _sync(self, g: Group) -> None:
        lag = self.step - g.synced_step
        if g.state == GroupState.RUNNING and lag:
            g.generated += lag
            g.kv_len += lag
        g.synced_step = self.step

    # ---- one step ----------------------------------------------------------------------------
    def schedule(self, now_s: float) -> StepPlan:
        """Mutates the strategy and the queues: decide and allocate this step's work."""
        strategy = self.strategy
        forks, copies = self.beams.take() if self.has_beams else ((), [])
        swap_out: list[np.ndarray] = []
        preemptions = 0
        ids = self.decode_ids()
        while ids and not strategy.can_append(ids):
            partial = self._partial()
            holders = self.running if partial is None else [*self.running, partial]
            victim = max(holders, key=lambda g: g.index)
            if len(holders) == 1:
                self._leave_running(victim)
                self._free_group(victim)
                self._reject(victim, "needs more KV slots than the whole pool")
            else:
                moves = self._preempt(victim)
                if moves is not None:
                    swap_out.append(moves)
                preemptions += 1
            ids = self.decode_ids()
        decode_groups = tuple(self.running)
        decode_seq_ids = positions = token_ids = None
        if ids:
            if self.needs_token_ids:
                decode_seq_ids, positions = self._decode_positions(ids)
                token_ids = self.tokens.generated(decode_seq_ids, positions - self._prompt_len)
            result = strategy.append(ids, token_ids) if strategy.wants_token_ids else strategy.append(ids)
            decode_slots = result.slots
            decode_group_slots = getattr(result, "group_slots", None)  # a hybrid pool's per-group slots
            if len(result.copies):
                copies.append(result.copies)
            self.meter.decoded(len(ids), self.step)
        else:
            decode_slots = NO_SLOTS
            decode_group_slots = None
        budget = self.max_num_batched_tokens - (len(ids) if self.chunks is not None else 0)

        started: list[Group] = []
        swap_in: list[np.ndarray] = []
        prefills: list[Prefill] = []
        refused_extent = 0
        if not preemptions:
            if self._partial() is not None:
                budget = self._continue_prefill(prefills, copies, budget)
            self._swap_in(started, swap_in)
            if not self.swapped and self._partial() is None:
                refused_extent = self._admit(now_s, prefills, copies, budget)
        copies_arr = _concat(copies)
        swap_out_arr, swap_in_arr = _concat(swap_out), _concat(swap_in)
        mapped = mapped_pages(strategy)
        cost = self.meter.cost(len(ids), prefills, started, len(copies_arr), len(swap_out_arr) + len(swap_in_arr),
                               mapped - self.mapped_pages_seen)
        self.mapped_pages_seen = mapped
        host_moves = take_host_moves(strategy)  # a prefix cache's host tier: this step's demotes and promotes
        demote, promote = (NO_PAIRS, NO_PAIRS) if host_moves is None else host_moves
        if len(promote):
            cost = cost._replace(loaded_blocks=len(promote))
        kernel = None
        if self.kernel_every is not None:
            kernel = kernel_inputs(strategy, self.step % self.kernel_every == 0, ids, decode_seq_ids, positions,
                                   token_ids, prefills, decode_group_slots)
        return StepPlan(step=self.step, decode_groups=decode_groups, started=tuple(started),
                        prefills=tuple(prefills), decode_slots=decode_slots, swap_out=swap_out_arr,
                        swap_in=swap_in_arr, copies=copies_arr, forks=tuple(forks), preemptions=preemptions,
                        refused_extent_slots=refused_extent, snapshot=strategy.snapshot(refused_extent), cost=cost,
                        kernel=kernel, unmapped=drain_unmapped(strategy), demote=demote, promote=promote)

    def complete(self, plan: StepPlan, now_s: float) -> int:
        """Mutates. The step ended at `now_s`: every scheduled sequence produced one token and finished
        groups are freed. Returns how many groups finished."""
        self.step += 1
        step = self.step
        if self.has_beams:
            for g in plan.decode_groups:
                if g.request.beam_width > 1:
                    self._sync(g)
                    self._advance_beams(g)
        for p in plan.prefills:
            if not p.completes:  # a chunk before the last: the group stays PREFILLING
                continue
            g = p.group
            g.generated += 1
            self.log.first_token(g.index, now_s)
            if g.request.beam_width > 1:
                self._advance_beams(g)
            self._start_decoding(g)
        for g in plan.started:
            self._start_decoding(g)
        finished = 0
        for g, epoch in self.finish_at.pop(step, ()):
            if g.epoch != epoch:
                continue
            self._leave_running(g)
            self._free_group(g)
            for seq_id in g.seq_ids:
                self.tokens.remove(seq_id)
            g.state = GroupState.DONE
            self.log.finished(g.index, now_s, g.request.output_tokens * g.num_seqs)
            finished += 1
        return finished

    def _advance_beams(self, g: Group) -> None:
        if self.beams.advance(g) and g.state == GroupState.RUNNING:
            self._decode_ids = None

    def _start_decoding(self, g: Group) -> None:
        """A STARTING group joins the decode batch; it finishes after (output - generated) more steps."""
        left = g.request.output_tokens - g.generated
        g.synced_step = self.step
        self.finish_at.setdefault(self.step + left, []).append((g, g.epoch))
        if left:  # a group with nothing left stays STARTING and finishes in this `complete`
            g.state = GroupState.RUNNING
            self.running.append(g)
            if self._decode_ids is not None:  # extend the batch (a new list: plans keep the old one)
                self._decode_ids = self._decode_ids + g.seq_ids
            self.meter.add(g, self.step, +1)

    # ---- admission ---------------------------------------------------------------------------
    def _continue_prefill(self, prefills: list[Prefill], copies: list[np.ndarray], budget: int) -> int:
        """The partially prefilled group computes its next chunk; returns the budget left. Without room
        for it the group waits for running groups to free blocks, unless none runs: then no
        block will ever come free and it is rejected."""
        g = self.chunks.group
        prefill = self.chunks.advance(budget, copies)
        if prefill is not None:
            prefills.append(prefill)
            return budget - prefill.write_tokens
        if not self.running:
            self._leave_running(g)
            self._free_group(g)
            self.chunks.group = None
            self._reject(g, "needs more KV slots than the whole pool")
        return budget

    def _admit(self, now_s: float, prefills: list[Prefill], copies: list[np.ndarray], budget: int) -> int:
        """Admit waiting groups in order until one does not fit or (chunked prefill) a chunk spends the
        budget; returns the extent refused to the first group that did not fit (0 if none). With
        admission `skip` a group the pool cannot place stays waiting and the next one is tried; the
        step's token budget and `max_num_seqs` still stop admission."""
        passed = 0  # groups left waiting ahead of the one tried (admission skip), in arrival order
        refused_extent = 0
        # (skip) the fewest blocks and the smallest extent refused this step: admissions only take memory,
        # so a group needing at least as much is refused too and is passed without asking the strategy
        fewest_blocks = smallest_extent = MAX_PASS_KEY
        while len(self.waiting) > passed:
            g = self.waiting[passed]
            tokens = g.request.prompt_tokens + g.generated  # a recomputed group re-prefills what it generated
            num_seqs = g.num_seqs_requested
            if num_seqs > self.max_num_seqs:
                self._reject(self._take_waiting(passed), f"{num_seqs} sequences > max_num_seqs ({self.max_num_seqs})")
                continue
            if self.chunks is not None:
                tokens = min(tokens, budget)  # the first chunk; blocks follow the chunks
            if tokens > budget or not budget or self.num_running_seqs + num_seqs > self.max_num_seqs:
                return refused_extent
            pool_empty = self.num_running_seqs == 0 and not self.swapped
            needed_blocks = cdiv(tokens, self.block_size) + num_seqs - 1
            if passed and (needed_blocks >= fewest_blocks
                           or self.refused_extents.get(g.index, 0) >= smallest_extent):
                passed += 1
                continue
            if self.watermark_blocks:
                if self.strategy.num_allocatable_blocks() - needed_blocks < self.watermark_blocks:
                    if pool_empty:
                        self._reject(self._take_waiting(passed), "needs more KV blocks than the pool holds above "
                                                                 "the watermark")
                        continue
                    if not self.skip_unplaced:
                        return 0
                    fewest_blocks = min(fewest_blocks, needed_blocks)
                    passed += 1
                    continue
            self._add_sequences(g, num_seqs)
            if self.chunks is None:
                outcome = admit_group(self.strategy, self.tokens, g, num_seqs, copies, pool_empty)
            else:
                outcome = self.chunks.admit(g, budget, copies)
                if not isinstance(outcome, Prefill):
                    outcome = Refused(outcome.needed_extent_slots, outcome.reason)
            if isinstance(outcome, Refused):
                if pool_empty:  # nothing will ever come free for it: the strategy's reason, when it gave one
                    reason = outcome.reason or "needs more KV slots than the whole pool"
                    self._reject(self._take_waiting(passed), reason)
                    continue
                if not self.skip_unplaced:
                    return outcome.needed_extent_slots
                refused_extent = refused_extent or outcome.needed_extent_slots
                if outcome.needed_extent_slots:
                    self.refused_extents[g.index] = outcome.needed_extent_slots
                    smallest_extent = min(smallest_extent, outcome.needed_extent_slots)
                passed += 1
                continue
            self._take_waiting(passed)
            self.log.admitted(g.index, now_s, outcome.cached_tokens)
            self.num_running_seqs += num_seqs
            budget -= outcome.write_tokens
            prefills.append(outcome)
            if not outcome.completes:  # its chunk spent the budget (or the pool has no room for more)
                return refused_extent
        return refused_extent

    def _take_waiting(self, i: int) -> Group:
        """Mutates. Remove and return the i-th waiting group."""
        g = self.waiting[i]
        del self.waiting[i]
        self.refused_extents.pop(g.index, None)
        return g

    def _add_sequences(self, g: Group, num_seqs: int) -> None:
        """Mutates. A group's sequences get their ids and tokens at its first admission."""
        if not g.seq_ids:
            g.seq_ids = list(range(self.next_seq_id, self.next_seq_id + num_seqs))
            self.next_seq_id += num_seqs
            self.tokens.add(g.seq_ids, g.request)

    # ---- preemption and swapping -------------------------------------------------------------
    def _preempt(self, g: Group) -> np.ndarray | None:
        """Mutates. Take a running group off the device, all or nothing: swap it to the host pool when
        swapping is on and the host has room, else free it for recompute. Returns the swap moves."""
        partial = g.state == GroupState.PREFILLING  # a partial prefill is recomputed, never swapped
        if partial:
            self.chunks.group = None
        self._leave_running(g)
        self.log.preempted(g.index)
        if self.swap and not partial and self.strategy.can_swap_out(g.seq_ids):
            moves = self.strategy.swap_out(g.seq_ids).moves
            g.state = GroupState.SWAPPED
            self.swapped.appendleft(g)
            return moves
        self._free_group(g)
        g.state = GroupState.WAITING
        self.waiting.appendleft(g)
        return None

    def _swap_in(self, started: list[Group], swap_in: list[np.ndarray]) -> None:
        while self.swapped:
            g = self.swapped[0]
            if self.num_running_seqs + g.num_seqs > self.max_num_seqs or not self.strategy.can_swap_in(g.seq_ids):
                return
            self.swapped.popleft()
            swap_in.append(self.strategy.swap_in(g.seq_ids).moves)
            g.state = GroupState.STARTING
            self.num_running_seqs += g.num_seqs
            started.append(g)

    def _leave_running(self, g: Group) -> None:
        """The group stops holding device KV (finished, preempted or rejected); its counters are synced."""
        if g.state == GroupState.RUNNING:
            self._sync(g)
            self.running.remove(g)
            self._decode_ids = None
            self.meter.add(g, self.step, -1)
        self.num_running_seqs -= g.num_seqs
        g.epoch += 1

    def _free_group(self, g: Group) -> None:
        for seq_id in g.seq_ids:
            self.strategy.free(seq_id)

    def _reject(self, g: Group, reason: str) -> None:
        g.state = GroupState.DONE
        for seq_id in g.seq_ids:
            self.tokens.remove(seq_id)
        self.log.rejected(g.index, reason)


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    """Pair arrays int32 [k_i, 2] as one int32 [sum k_i, 2], in order."""
    if not parts:
        return NO_PAIRS
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
