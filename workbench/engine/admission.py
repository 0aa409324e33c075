"""Admission: which waiting groups enter the pool this step, and placing each one (docs/engine.md).

Waiting groups are tried in arrival order under `max_num_seqs`, the step's token budget and (paged
strategies) a free-block watermark. `place` is the one way a group gets its KV: whole or chunked
(workbench.engine.prefill_chunks), first admission or readmission after a recompute preemption. A readmitted
group allocates its prompt plus the tokens it had generated: one sequence re-prefills them as part of
its prompt; n > 1 samples share the prompt and each appends its own generated tokens.

With admission `skip`, a group the pool cannot place stays waiting and the next one is tried.

A group whose prompt KV was shipped from a prefill replica (disaggregated prefill/decode, docs/fleet.md)
waits in the same queue under the same rules (order, max_num_seqs, watermark) but spends no token budget:
its admission allocates the prompt's blocks and writes the shipped rows (`Landed`), computing nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from workbench.allocators.base import Strategy
from workbench.allocators.values import AdmitResult, SeqSpec
from workbench.engine import reasons, rules
from workbench.engine.groups import Group, GroupState
from workbench.engine.plan import Landed, Prefill
from workbench.engine.request_log import RequestLog
from workbench.engine.tokens import TokenStore
from workbench.intmath import cdiv

MAX_PASS_KEY = 2**63  # larger than any block count or extent: nothing refused yet


# chunked prefill's admission of a group's first chunk (`prefill_chunks.PrefillChunks.admit`): the group, the
# token budget, the step's copy-on-write pairs; a `Prefill` or the strategy's refusal
AdmitChunk = Callable[[Group, int, list[np.ndarray]], Prefill | AdmitResult]


@dataclass(frozen=True, slots=True)
class Refused:
    """The group did not fit; `needed_extent_slots` > 0 for a contiguous extent; `reason` is the strategy's
    (empty when the scheduler's own bound refused it)."""

    needed_extent_slots: int
    reason: str = ""


class Admission:
    """Owns the waiting queue and the sequence ids; mutates the strategy, the token store, the groups and
    the request log it is given."""

    def __init__(self, strategy: Strategy, tokens: TokenStore, log: RequestLog, admit_chunk: AdmitChunk | None,
                 live: dict[int, Group], *, max_num_seqs: int, watermark_blocks: int, skip_unplaced: bool) -> None:
        """`live`: the scheduler's groups by request index, from arrival until done (a rejection removes one).
        `admit_chunk`: with chunked prefill, what admits a group's first chunk (`PrefillChunks.admit`)."""
        self.strategy = strategy
        self.live = live
        self.tokens = tokens
        self.log = log
        self.admit_chunk = admit_chunk
        self.max_num_seqs = max_num_seqs
        self.watermark_blocks = watermark_blocks
        self.skip_unplaced = skip_unplaced  # pass over waiting groups the pool cannot place (docs/engine.md)
        self.waiting: deque[Group] = deque()
        self.refused_extents: dict[int, int] = {}  # (skip) group index -> the contiguous extent it was refused
        self.next_seq_id = 0

    def new_seq_id(self) -> int:
        self.next_seq_id += 1
        return self.next_seq_id - 1

    def arrive(self, groups: Iterable[Group], max_model_len: int) -> None:
        """Mutates. Arrived groups join the waiting queue, or are rejected when prompt and output together
        pass `max_model_len`."""
        for g in groups:
            req = g.request
            if rules.too_long(req.prompt_tokens, req.output_tokens, max_model_len):
                self.reject(g, reasons.too_long(req.prompt_tokens + req.output_tokens, max_model_len))
            else:
                self.live[g.index] = g
                self.waiting.append(g)

    def reject(self, g: Group, reason: str) -> None:
        """Mutates. The group will never run: it is done, its tokens forgotten, the reason logged."""
        g.state = GroupState.DONE
        self.live.pop(g.index, None)
        for seq_id in g.seq_ids:
            self.tokens.remove(seq_id)
        self.log.rejected(g.index, reason)

    def admit(self, now_s: float, running_seqs: int, held_seqs: int, prefills: list[Prefill],
              copies: list[np.ndarray], budget: int, landed: list[Landed]) -> tuple[int, int]:
        """Admit waiting groups in order until one does not fit or (chunked prefill) a chunk spends the
        budget, with `running_seqs` sequences on the device, `held_seqs` finished ones whose blocks a link is
        still reading (their blocks will come free) and no group swapped out; groups whose KV was
        shipped here go to `landed`. Returns (the extent refused to the first group that did not fit (0 if
        none), the sequences on the device after)."""
        passed = 0  # groups left waiting ahead of the one tried (admission skip), in arrival order
        refused_extent = 0
        # (skip) the fewest blocks and the smallest extent refused this step: admissions only take memory,
        # so a group needing at least as much is refused too and is passed without asking the strategy
        fewest_blocks = smallest_extent = MAX_PASS_KEY
        while len(self.waiting) > passed:
            g = self.waiting[passed]
            tokens = rules.recompute_tokens(g.request.prompt_tokens, g.generated)
            num_seqs = g.num_seqs_requested
            if num_seqs > self.max_num_seqs:
                self.reject(self._take(passed), f"{num_seqs} sequences > max_num_seqs ({self.max_num_seqs})")
                continue
            if g.transferred:  # blocks for the shipped prompt, no compute: no token budget
                tokens = g.request.prompt_tokens
            elif self.admit_chunk is not None:
                tokens = min(tokens, budget)  # the first chunk; blocks follow the chunks
            # held sequences are on the device too: their blocks will come free, so a refusal is not final
            pool_empty = rules.refusal_is_final(running_seqs + held_seqs)
            needed_blocks = rules.blocks_needed(tokens, self.strategy.block_size, num_seqs,
                                                self.strategy.state_blocks_per_seq, self.strategy.pool_blocks_per_block)
            # the free blocks are asked for only where a watermark reads them (a call into the strategy)
            allocatable = self.strategy.num_allocatable_blocks() if self.watermark_blocks else 0
            verdict = rules.admission_verdict(tokens, budget, not g.transferred, running_seqs, num_seqs,
                                              self.max_num_seqs, needed_blocks, allocatable, self.watermark_blocks)
            if verdict == rules.STOP:
                return refused_extent, running_seqs
            if passed and (needed_blocks >= fewest_blocks
                           or self.refused_extents.get(g.index, 0) >= smallest_extent):
                passed += 1
                continue
            if verdict == rules.BELOW_WATERMARK:
                if pool_empty:
                    self.reject(self._take(passed), reasons.ABOVE_WATERMARK)
                    continue
                if not self.skip_unplaced:
                    return 0, running_seqs
                fewest_blocks = min(fewest_blocks, needed_blocks)
                passed += 1
                continue
            outcome = self.place(g, num_seqs, budget, copies)
            if isinstance(outcome, Refused):
                if pool_empty:  # nothing will ever come free for it: the strategy's reason, when it gave one
                    self.reject(self._take(passed), outcome.reason or reasons.OUTGROWS_POOL)
                    continue
                if not self.skip_unplaced:
                    return outcome.needed_extent_slots, running_seqs
                refused_extent = refused_extent or outcome.needed_extent_slots
                if outcome.needed_extent_slots:
                    self.refused_extents[g.index] = outcome.needed_extent_slots
                    smallest_extent = min(smallest_extent, outcome.needed_extent_slots)
                passed += 1
                continue
            self._take(passed)
            self.log.admitted(g.index, now_s, outcome.cached_tokens)
            running_seqs += num_seqs
            if isinstance(outcome, Landed):  # its first token came with its KV: TTFT ends here (docs/fleet.md)
                self.log.first_token(g.index, now_s)
                landed.append(outcome)
                continue
            budget -= outcome.write_tokens
            prefills.append(outcome)
            if not outcome.completes:  # its chunk spent the budget (or the pool has no room for more)
                break
        return refused_extent, running_seqs

    def _take(self, i: int) -> Group:
        """Mutates. Remove and return the i-th waiting group."""
        g = self.waiting[i]
        del self.waiting[i]
        self.refused_extents.pop(g.index, None)
        return g

    # ---- placing one group -------------------------------------------------------------------
    def place(self, g: Group, num_seqs: int, budget: int, copies: list[np.ndarray]) -> Prefill | Landed | Refused:
        """Mutates on success: the group's sequences (ids and tokens at its first admission) get the
        KV of its prompt, plus what it generated before a recompute; with chunked prefill only the
        first chunk of at most `budget` tokens. Block copies go to `copies`. On refusal the strategy
        is unchanged."""
        if not g.seq_ids:
            g.seq_ids = list(range(self.next_seq_id, self.next_seq_id + num_seqs))
            self.next_seq_id += num_seqs
            self.tokens.add(g.seq_ids, g.request)
        if g.transferred:
            return self._land(g, copies)
        if self.admit_chunk is not None:
            outcome = self.admit_chunk(g, budget, copies)
            return outcome if isinstance(outcome, Prefill) else Refused(outcome.needed_extent_slots, outcome.reason)
        return self._place_whole(g, num_seqs, copies)

    def _land(self, g: Group, copies: list[np.ndarray]) -> Landed | Refused:
        """A shipped prompt takes its blocks whole (never in chunks: its KV exists already); a prefix cache
        supplies what it holds, and the rest of the rows are written from the shipped copy."""
        result = self.strategy.admit(g.seq_ids, SeqSpec(g.request.prompt_token_ids(), g.final_len))
        if not result.admitted:
            return Refused(result.needed_extent_slots, result.reason)
        if result.copies is not None and len(result.copies):
            copies.append(result.copies)
        g.kv_len = g.request.prompt_tokens
        g.transferred = False  # from now on it is any decoding group: a recompute preemption recomputes
        g.state = GroupState.STARTING
        return Landed(g.index, g.seq_ids[0], result.cached_tokens, g.kv_len)

    def _place_whole(self, g: Group, num_seqs: int, copies: list[np.ndarray]) -> Prefill | Refused:
        strategy = self.strategy
        req = g.request
        recomputed = g.generated
        by_blocks = strategy.grows_by_blocks
        if strategy.needs_prompt_ids:
            spec = SeqSpec(self.tokens.held_in_common(req, g.seq_ids, recomputed), g.final_len)
        else:  # the count is all it reads (`held_in_common`'s length)
            spec = SeqSpec(None, g.final_len, num_tokens=req.prompt_tokens + (recomputed if g.num_seqs == 1 else 0))
        if num_seqs > 1 and recomputed and by_blocks:
            # the appends below must not fail once the prompt is admitted (its blocks may be registered
            # in a prefix cache before their KV is written): check an upper bound of the blocks first —
            # the shared prompt, then per sequence its own tokens plus a copy of the shared last block.
            # An empty pool too: beams that shared what they generated before the preemption each hold
            # their own copy of it now, which may be more than the whole pool (the group is then rejected).
            bs = strategy.block_size
            needed = cdiv(req.prompt_tokens, bs) + num_seqs * (cdiv(recomputed, bs) + 1)
            if strategy.num_allocatable_blocks() < needed * strategy.pool_blocks_per_block:
                return Refused(0)
        copies_before = len(copies)
        result = strategy.admit(g.seq_ids, spec)
        if not result.admitted:
            return Refused(result.needed_extent_slots, result.reason)
        if result.copies is not None and len(result.copies):
            copies.append(result.copies)
        g.kv_len = spec.num_tokens
        write_tokens = spec.num_tokens - result.cached_tokens
        if num_seqs > 1 and recomputed:
            # each sample's own generated tokens follow the shared prompt: one append per position
            for j in range(recomputed):
                if not by_blocks and not strategy.can_append(g.seq_ids):
                    # memory mapped on demand (virtual-contiguous) ran out before the samples' own tokens:
                    # undo the admission (nothing is written yet, no prefix cache holds these slots)
                    for seq_id in g.seq_ids:
                        strategy.free(seq_id)
                    del copies[copies_before:]  # nor are its copies made: their slots may be another group's now
                    return Refused(0)
                self.tokens.append_own(strategy, g.seq_ids, j, copies)
            g.kv_len += recomputed
            write_tokens += recomputed * num_seqs
        g.state = GroupState.STARTING
        return Prefill(g.index, tuple(g.seq_ids), req.prompt_tokens, result.cached_tokens, write_tokens,
                       result.cached_tokens, g.kv_len, True)
