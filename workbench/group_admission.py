"""Placing one waiting group's prompt in the pool (the scheduler decides which group and when).

A group admitted for the first time allocates its prompt. A group readmitted after a recompute
preemption allocates its prompt plus the tokens it had generated: one sequence re-prefills them as
part of its prompt; n > 1 samples share the prompt and each appends its own generated tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.allocators.base import SeqSpec, Strategy
from workbench.groups import Group, GroupState
from workbench.intmath import cdiv
from workbench.plan import Prefill
from workbench.prefill_chunks import append_recomputed
from workbench.tokens import TokenStore


@dataclass(frozen=True, slots=True)
class Refused:
    """The group did not fit; `needed_extent_slots` > 0 for a contiguous extent; `reason` is the strategy's
    (empty when the scheduler's own bound refused it)."""

    needed_extent_slots: int
    reason: str = ""


def admit_group(strategy: Strategy, tokens: TokenStore, g: Group, num_seqs: int, copies: list[np.ndarray],
                pool_empty: bool) -> Prefill | Refused:
    """Allocate the group's prompt (plus what it generated before a recompute) and mark it STARTING; on
    refusal the strategy is unchanged. Mutates the strategy, `g` and `copies` (appends block copies)."""
    req = g.request
    recomputed = g.generated
    paged = strategy.kernel_mode == "paged"
    if num_seqs == 1 and recomputed:
        token_ids = tokens.logical(g.seq_ids[0], req.prompt_tokens + recomputed)
    else:
        token_ids = req.prompt_token_ids()
    if num_seqs > 1 and recomputed and paged and not pool_empty:
        # the appends below must not fail once the prompt is admitted (its blocks may be registered
        # in a prefix cache before their KV is written): check an upper bound of the blocks first —
        # the shared prompt, then per sequence its own tokens plus a copy of the shared last block.
        # An empty pool always has room: the group held these blocks before it was preempted.
        bs = strategy.block_size
        needed = cdiv(req.prompt_tokens, bs) + num_seqs * (cdiv(recomputed, bs) + 1)
        if strategy.num_allocatable_blocks() < needed:
            return Refused(0)
    result = strategy.admit(g.seq_ids, SeqSpec(token_ids, g.final_len))
    if not result.admitted:
        return Refused(result.needed_extent_slots, result.reason)
    if result.copies is not None and len(result.copies):
        copies.append(result.copies)
    g.kv_len = len(token_ids)
    write_tokens = len(token_ids) - result.cached_tokens
    if num_seqs > 1 and recomputed:
        # each sample's own generated tokens follow the shared prompt: one append per position
        for j in range(recomputed):
            if not paged and not strategy.can_append(g.seq_ids):
                # memory mapped on demand (virtual-contiguous) ran out before the samples' own tokens:
                # undo the admission (nothing is written yet, no prefix cache holds these slots)
                for seq_id in g.seq_ids:
                    strategy.free(seq_id)
                return Refused(0)
            append_recomputed(strategy, tokens, g, j, copies)
        g.kv_len += recomputed
        write_tokens += recomputed * num_seqs
    g.state = GroupState.STARTING
    return Prefill(g, result.cached_tokens, write_tokens, result.cached_tokens, g.kv_len, True)
