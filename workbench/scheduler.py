"""FCFS continuous batching over one allocation strategy (docs/engine.md): which groups run each step.

A request becomes a *group* of sequences sharing its prompt (n parallel samples or beam_width
beams; workbench.groups).

Per step (`schedule`): running groups get one slot per sequence (preempting the latest-arrived
group, all or nothing, while that is impossible), then — only if nothing was preempted — swapped
groups come back and waiting groups are admitted in arrival order, under `max_num_seqs`, a prefill
budget of `max_num_batched_tokens` and (paged strategies) a free-block watermark. `complete`
then advances the tokens and retires finished groups. Only the strategy's integers change here;
the engine executes the resulting copies, moves and writes on the KV pool.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from workbench.allocators.base import SeqSpec, Strategy
from workbench.groups import DONE, RUNNING, STARTING, SWAPPED, WAITING, Group, Prefill, StepPlan, generated_token_ids
from workbench.workload.beam import beam_step
from workbench.workload.request import Request, output_key, output_keys, token_ids_for


class Scheduler:
    """Owns the queues and the per-request records; mutates the strategy it is given."""

    def __init__(self, strategy: Strategy, requests: list[Request], *, max_model_len: int, max_num_seqs: int,
                 max_num_batched_tokens: int, watermark_frac: float, swap: bool, seed: int) -> None:
        self.strategy = strategy
        self.requests = requests
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.paged = strategy.kernel_mode == "paged"
        self.block_size = strategy.block_size
        self.watermark_blocks = int(watermark_frac * (strategy.capacity_slots // self.block_size)) if self.paged else 0
        self.swap = swap and strategy.supports_swap  # else preemption recomputes
        self.seed = seed
        self.next_arrival = 0  # index of the first request not yet arrived
        self.waiting: deque[Group] = deque()
        self.swapped: deque[Group] = deque()
        self.running: list[Group] = []  # decoding groups, in the order they joined
        self.num_running_seqs = 0  # sequences holding device KV: RUNNING and STARTING groups
        self.next_seq_id = 0
        self.step = 0  # completed steps
        self.finish_at: dict[int, list[tuple[Group, int]]] = {}  # step -> (group, epoch) finishing then
        self._decode_ids: list[int] | None = None  # the flattened running sequences, rebuilt on change
        # Strategies that cache decode-filled blocks get each appended token's id. Token s of sample j
        # is token_ids_for(output_key(request, j), s); a decoding sequence writes token
        # `_decode_token_base + step` at the step's append. Rebuilt when the batch list changes.
        self.wants_token_ids = strategy.wants_token_ids
        self._decode_token_batch: list[int] | None = None  # the batch list the two arrays describe
        self._decode_token_keys = np.zeros(0, dtype=np.uint64)  # [num_decode]
        self._decode_token_base = np.zeros(0, dtype=np.int64)  # [num_decode]
        # Running totals over the decoding sequences, kept in O(1) per step. A running group's kv_len
        # is v + (completed steps) for a fixed v, so its block count grows at the append where
        # (v + completed steps) % block_size == 0: `_crossing[r]` counts sequences with v % bs == r.
        self._decode_ctx = 0  # sum of kv_len
        self._unshared_blocks = 0  # sum of ceil(kv_len / block_size)
        self._crossing = [0] * self.block_size
        self.beam_tokens: dict[int, list[int]] = {}  # beam sequence id -> its generated token ids
        self.forks: list[tuple[int, int]] = []  # (parent, child) beam forks since the last schedule
        self._fork_copies: list[np.ndarray] = []  # their copy-on-write pairs, run with the next step
        self._refused_extent = 0
        n = len(requests)
        # per-request records (requests.parquet), NaN until the event happens
        self.admitted_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.prefix_hit_tokens = np.zeros(n, dtype=np.int64)
        self.num_preemptions = np.zeros(n, dtype=np.int64)
        self.status = ["pending"] * n
        self.generated_tokens = 0  # tokens of finished requests, every sample counted
        self.num_rejected = 0
        self.has_beams = any(r.beam_width > 1 for r in requests)

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
        return bool(self.running or self.waiting or self.swapped)

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

    def _decode_token_ids(self, ids: list[int]) -> np.ndarray:
        """Ids of the tokens the decode batch `ids` writes this step, int32 [len(ids)]: each sequence's
        latest generated token (a group's `generated` - `synced_step` is constant while it runs)."""
        if self._decode_token_batch is not ids:
            running = self.running
            sizes = np.fromiter((g.num_seqs for g in running), dtype=np.int64, count=len(running))
            request_ids = np.repeat([g.request.request_id for g in running], sizes)  # [num_decode]
            samples = np.arange(len(ids)) - np.repeat(np.cumsum(sizes) - sizes, sizes)  # index in its group
            keys = np.empty(len(ids), dtype=np.uint64)
            for j in range(int(sizes.max())):
                keys[samples == j] = output_keys(request_ids[samples == j], j)
            self._decode_token_keys = keys
            self._decode_token_base = np.repeat([g.generated - g.synced_step - 1 for g in running], sizes)
            self._decode_token_batch = ids
        offsets = self._decode_token_base + self.step
        tokens = generated_token_ids(self._decode_token_keys, offsets)
        if self.has_beams:
            for i, seq_id in enumerate(ids):
                beam = self.beam_tokens.get(seq_id)
                if beam is not None:
                    tokens[i] = beam[offsets[i]]
        return tokens

    def _token_ids_at(self, g: Group, offset: int) -> np.ndarray:
        """Ids of generated token `offset` of each of the group's sequences, int32 [num_seqs]."""
        tokens = np.array([token_ids_for(output_key(g.request.request_id, j), offset, offset + 1)[0]
                           for j in range(g.num_seqs)], dtype=np.int32)
        for i, seq_id in enumerate(g.seq_ids):
            beam = self.beam_tokens.get(seq_id)
            if beam is not None:
                tokens[i] = beam[offset]
        return tokens

    def _sync(self, g: Group) -> None:
        lag = self.step - g.synced_step
        if g.state == RUNNING and lag:
            g.generated += lag
            g.kv_len += lag
        g.synced_step = self.step

    # ---- one step ----------------------------------------------------------------------------
    def schedule(self, now_s: float) -> StepPlan:
        """Mutates the strategy and the queues: decide and allocate this step's work."""
        strategy = self.strategy
        copies, self._fork_copies = self._fork_copies, []
        swap_out: list[np.ndarray] = []
        preemptions = 0
        ids = self.decode_ids()
        while ids and not strategy.can_append(ids):
            victim = max(self.running, key=lambda g: g.index)
            if len(self.running) == 1:
                self._leave_running(victim)
                self._free_group(victim)
                self._reject(victim, "needs more KV slots than the whole pool")
            else:
                moves = self._preempt(victim)
                if moves is not None:
                    swap_out.append(moves)
                preemptions += 1
            ids = self.decode_ids()
        decode_groups = self.running
        if ids:
            result = strategy.append(ids, self._decode_token_ids(ids)) if self.wants_token_ids else strategy.append(ids)
            decode_slots = result.slots
            if len(result.copies):
                copies.append(result.copies)
            self._decode_ctx += len(ids)
            self._unshared_blocks += self._crossing[-self.step % self.block_size]
        else:
            decode_slots = np.zeros(0, dtype=np.int64)
        kv_read = attn_ctx = self._decode_ctx

        started: list[Group] = []
        swap_in: list[np.ndarray] = []
        prefills: list[Prefill] = []
        refused_extent = 0
        if not preemptions:
            self._swap_in(started, swap_in)
            if not self.swapped:
                refused_extent = self._admit(now_s, prefills, copies)
        num_prefill = 0
        num_running = len(ids)
        bs = self.block_size
        unshared = self._unshared_blocks * bs  # whole-block slots the sequences would fill unshared
        for p in prefills:
            num_prefill += p.write_tokens
            g = p.group
            kv_read += g.kv_len * g.num_seqs
            unshared += g.num_seqs * -(-g.kv_len // bs) * bs
            num_running += g.num_seqs
            # queries at positions [cached, kv_len) attend to positions 0..p: the sum of (p + 1)
            attn_ctx += (g.kv_len * (g.kv_len + 1) - p.cached_tokens * (p.cached_tokens + 1)) // 2
        for g in started:  # swapped back in: holding blocks, computing from the next step
            unshared += g.num_seqs * -(-g.kv_len // bs) * bs
        forks, self.forks = self.forks, []
        return StepPlan(decode_groups, started, ids, decode_slots, prefills, copies, swap_out, swap_in, forks,
                        preemptions, refused_extent, strategy.snapshot(refused_extent), num_prefill, kv_read,
                        attn_ctx, unshared, num_running, sum(len(c) for c in copies) if copies else 0,
                        sum(len(m) for m in swap_out) + sum(len(m) for m in swap_in) if swap_out or swap_in else 0)

    def complete(self, plan: StepPlan, now_s: float) -> int:
        """Mutates. The step ended at `now_s`: every scheduled sequence produced one token and finished
        groups are freed. Returns how many groups finished."""
        self.step += 1
        step = self.step
        output = 0
        if self.has_beams:
            for g in plan.decode_groups:
                if g.request.beam_width > 1:
                    self._sync(g)
                    self._beam_advance(g)
        for p in plan.prefills:
            g = p.group
            g.generated += 1
            if math.isnan(self.first_token_s[g.index]):
                self.first_token_s[g.index] = now_s
            if g.request.beam_width > 1:
                self._beam_advance(g)
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
                self.beam_tokens.pop(seq_id, None)
            g.state = DONE
            self.finish_s[g.index] = now_s
            self.status[g.index] = "finished"
            output += g.request.output_tokens * g.num_seqs
            finished += 1
        self.generated_tokens += output
        return finished

    def _start_decoding(self, g: Group) -> None:
        """A STARTING group joins the decode batch; it finishes after (output - generated) more steps."""
        left = g.request.output_tokens - g.generated
        g.synced_step = self.step
        self.finish_at.setdefault(self.step + left, []).append((g, g.epoch))
        if left:  # a group with nothing left stays STARTING and finishes in this `complete`
            g.state = RUNNING
            self.running.append(g)
            if self._decode_ids is not None:  # extend the batch (a new list: plans keep the old one)
                self._decode_ids = self._decode_ids + g.seq_ids
            self._count_running(g, +1)

    def _beam_advance(self, g: Group) -> None:
        """Mutates. The group just produced token s = generated - 1: its beams become the survivors of
        `beam_step` (workbench.workload.beam): unparented beams are freed first, then a parent of k
        survivors is forked k - 1 times (its blocks shared, copy-on-write at the next append)."""
        if g.generated >= g.request.output_tokens:
            return  # finishes now: the survivors would be freed at once
        s = g.generated - 1
        beams = beam_step(g.request, s, self.seed)
        old_ids = g.seq_ids
        old_tokens = [self.beam_tokens.pop(seq_id, []) for seq_id in old_ids]
        if s == 0:  # every beam already holds the prompt (admitted together): beam i takes token i
            for i, seq_id in enumerate(old_ids):
                self.beam_tokens[seq_id] = [beams.token_ids[i]]
            return
        for b in beams.freed:
            self.strategy.free(old_ids[b])
        new_ids: list[int] = []
        continued: set[int] = set()
        for i, parent in enumerate(beams.parents):
            parent_id = old_ids[parent]
            if parent not in continued:
                continued.add(parent)
                new_ids.append(parent_id)
            else:
                child_id = self.next_seq_id
                self.next_seq_id += 1
                result = self.strategy.fork(parent_id, child_id)
                if not result.admitted:  # a fork replaces a freed beam of the same size
                    raise RuntimeError(f"request {g.request.request_id}: beam fork refused after freeing "
                                       f"{len(beams.freed)} beams: {result.reason}")
                if result.copies is not None and len(result.copies):
                    self._fork_copies.append(result.copies)
                self.forks.append((parent_id, child_id))
                new_ids.append(child_id)
            self.beam_tokens[new_ids[-1]] = old_tokens[parent] + [beams.token_ids[i]]
        g.seq_ids = new_ids
        if g.state == RUNNING:
            self._decode_ids = None

    # ---- admission ---------------------------------------------------------------------------
    def _admit(self, now_s: float, prefills: list[Prefill], copies: list[np.ndarray]) -> int:
        """Admit waiting groups in order until one does not fit; returns the refused extent (0 if none)."""
        budget = self.max_num_batched_tokens
        while self.waiting:
            g = self.waiting[0]
            req = g.request
            tokens = req.prompt_tokens + g.generated  # a recomputed group re-prefills what it generated
            num_seqs = req.n if req.beam_width == 1 else req.beam_width
            if num_seqs > self.max_num_seqs:
                self._reject(self.waiting.popleft(), f"{num_seqs} sequences > max_num_seqs ({self.max_num_seqs})")
                continue
            if tokens > budget or self.num_running_seqs + num_seqs > self.max_num_seqs:
                return 0
            pool_empty = self.num_running_seqs == 0 and not self.swapped
            if self.watermark_blocks:
                needed_blocks = -(-tokens // self.block_size) + num_seqs - 1
                if self.strategy.snapshot().num_free_blocks - needed_blocks < self.watermark_blocks:
                    if pool_empty:
                        self._reject(self.waiting.popleft(), "needs more KV blocks than the pool holds above "
                                                             "the watermark")
                        continue
                    return 0
            admitted = self._admit_group(g, num_seqs, copies, pool_empty)
            if admitted is None:
                if pool_empty:
                    self._reject(self.waiting.popleft(), "needs more KV slots than the whole pool")
                    continue
                return self._refused_extent
            self.waiting.popleft()
            if math.isnan(self.admitted_s[g.index]):
                self.admitted_s[g.index] = now_s
            budget -= admitted.write_tokens
            prefills.append(admitted)
        return 0

    def _admit_group(self, g: Group, num_seqs: int, copies: list[np.ndarray], pool_empty: bool) -> Prefill | None:
        """Allocate the group's prompt (plus what it generated before a recompute); None if refused,
        with the strategy unchanged."""
        req = g.request
        prompt = req.prompt_token_ids()
        if not g.seq_ids:
            g.seq_ids = list(range(self.next_seq_id, self.next_seq_id + num_seqs))
            self.next_seq_id += num_seqs
        recomputed = g.generated
        if num_seqs == 1 and recomputed:
            token_ids = np.concatenate([prompt, token_ids_for(output_key(req.request_id, 0), 0, recomputed)])
        else:
            token_ids = prompt
        if num_seqs > 1 and recomputed and self.paged and not pool_empty:
            # the appends below must not fail once the prompt is admitted (its blocks may be registered
            # in a prefix cache before their KV is written): check an upper bound of the blocks first —
            # the shared prompt, then per sequence its own tokens plus a copy of the shared last block.
            # An empty pool always has room: the group held these blocks before it was preempted.
            bs = self.block_size
            needed = -(-len(prompt) // bs) + num_seqs * (-(-recomputed // bs) + 1)
            if self.strategy.snapshot().num_free_blocks < needed:
                self._refused_extent = 0
                return None
        result = self.strategy.admit(g.seq_ids, SeqSpec(token_ids, g.final_len))
        if not result.admitted:
            self._refused_extent = result.needed_extent_slots
            return None
        if result.copies is not None and len(result.copies):
            copies.append(result.copies)
        g.kv_len = len(token_ids)
        write_tokens = len(token_ids) - result.cached_tokens
        if num_seqs > 1 and recomputed:
            # each sample's own generated tokens follow the shared prompt: one append per position
            for j in range(recomputed):
                step_copies = (self.strategy.append(g.seq_ids, self._token_ids_at(g, j)) if self.wants_token_ids
                               else self.strategy.append(g.seq_ids)).copies
                if len(step_copies):
                    copies.append(step_copies)
            g.kv_len += recomputed
            write_tokens += recomputed * num_seqs
        self.prefix_hit_tokens[g.index] += result.cached_tokens
        g.state = STARTING
        self.num_running_seqs += num_seqs
        return Prefill(g, result.cached_tokens, write_tokens)

    # ---- preemption and swapping -------------------------------------------------------------
    def _preempt(self, g: Group) -> np.ndarray | None:
        """Mutates. Take a running group off the device, all or nothing: swap it to the host pool when
        swapping is on and the host has room, else free it for recompute. Returns the swap moves."""
        self._leave_running(g)
        self.num_preemptions[g.index] += 1
        if self.swap and self.strategy.can_swap_out(g.seq_ids):
            moves = self.strategy.swap_out(g.seq_ids).moves
            g.state = SWAPPED
            self.swapped.appendleft(g)
            return moves
        self._free_group(g)
        g.state = WAITING
        self.waiting.appendleft(g)
        return None

    def _swap_in(self, started: list[Group], swap_in: list[np.ndarray]) -> None:
        while self.swapped:
            g = self.swapped[0]
            if self.num_running_seqs + g.num_seqs > self.max_num_seqs or not self.strategy.can_swap_in(g.seq_ids):
                return
            self.swapped.popleft()
            swap_in.append(self.strategy.swap_in(g.seq_ids).moves)
            g.state = STARTING
            self.num_running_seqs += g.num_seqs
            started.append(g)

    def _leave_running(self, g: Group) -> None:
        """The group stops holding device KV (finished, preempted or rejected); its counters are synced."""
        if g.state == RUNNING:
            self._sync(g)
            self.running.remove(g)
            self._decode_ids = None
            self._count_running(g, -1)
        self.num_running_seqs -= g.num_seqs
        g.epoch += 1

    def _count_running(self, g: Group, sign: int) -> None:
        """Add (+1) or remove (-1) a synced running group from the running totals."""
        n, bs = g.num_seqs, self.block_size
        self._decode_ctx += sign * g.kv_len * n
        self._unshared_blocks += sign * -(-g.kv_len // bs) * n
        self._crossing[(g.kv_len - self.step) % bs] += sign * n

    def _free_group(self, g: Group) -> None:
        for seq_id in g.seq_ids:
            self.strategy.free(seq_id)

    def _reject(self, g: Group, reason: str) -> None:
        self.num_rejected += 1
        g.state = DONE
        self.status[g.index] = f"rejected: {reason}"
