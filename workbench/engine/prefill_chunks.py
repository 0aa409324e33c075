"""Chunked prefill (Sarathi-Serve; vLLM v1's default scheduling): one prompt computed over several steps.

The budget. With `--chunked-prefill`, a step's `max_num_batched_tokens` pays for every token the
step computes: first one per decoding sequence, then the next chunk of the group whose prefill is
under way, then newly admitted groups, each taking a chunk that fills what is left. A chunk shorter
than the rest of its prompt spends the whole budget, so at most one group is partially prefilled at
any time (`PrefillChunks.group`). The budget is never below `max_num_seqs` (the config checks it),
so decodes always fit and a partial prefill always gets at least one token per sequence.

What a prefill computes. A group's prefill target is what a non-chunked admission writes: its
prompt, plus, after a recompute preemption, what it had generated. A single sequence treats all of
it as one token string. A group of several sequences (parallel samples, beams) shares the prompt;
each sequence's own recomputed tokens follow it, one position (one token per sequence) at a time.

Memory. A partially prefilled group holds exactly the blocks of the tokens computed so far, as
vLLM v1's `allocate_slots` allocates for the tokens scheduled this step: admission passes the whole
prompt with `SeqSpec.num_new_tokens` = the first chunk, so the prefix cache is looked up once, over
the whole prompt, and its hit is counted once; `Strategy.extend` then grows the shared prompt chunk
by chunk (a prefix cache registers the full blocks as the chunks fill them). Prompt tokens not yet
computed hold no slot and are no token slots; a contiguous reservation covers them as *reserved*,
exactly as it covers the decode tokens to come.

Kernels. Each chunk's KV rows [start, stop) are written in its step (`workbench.engine.plan.SeqWrite`), and
its extend attention has queries at the chunk's positions only, attending to every earlier position
(the prefix cached or computed by earlier chunks) and causally within the chunk.

Latency. Only the step of the last chunk produces the group's first token (TTFT), then it decodes.

Preemption. A partially prefilled group is preempted by recompute only (never swapped): its blocks
are freed and it returns to the front of the queue, to be admitted again from its first chunk.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.base import Strategy
from workbench.allocators.values import AdmitResult, SeqSpec
from workbench.engine.groups import Group, GroupState
from workbench.engine.plan import Prefill
from workbench.engine.tokens import TokenStore


class PrefillChunks:
    """Computes prefills chunk by chunk. Mutates the strategy and the groups it is given."""

    def __init__(self, strategy: Strategy, tokens: TokenStore) -> None:
        self.strategy = strategy
        self.tokens = tokens
        self.group: Group | None = None  # the partially prefilled group, if any

    def admit(self, g: Group, budget: int, copies: list[np.ndarray]) -> Prefill | AdmitResult:
        """Mutates on success: admit the group with its first chunk of at most `budget` tokens past the
        prefix hit. Returns the refused AdmitResult (nothing changed) when the strategy refuses."""
        token_ids = self.tokens.held_in_common(g.request, g.seq_ids, g.generated)
        result = self.strategy.admit(g.seq_ids, SeqSpec(token_ids, g.final_len, num_new_tokens=budget))
        if not result.admitted:
            return result
        if result.copies is not None and len(result.copies):
            copies.append(result.copies)
        cached = result.cached_tokens
        g.kv_len = cached + min(budget, token_ids.shape[0] - cached)
        written = g.kv_len - cached
        return self._close(g, cached, cached, written, budget - written, copies)

    def advance(self, budget: int, copies: list[np.ndarray]) -> Prefill | None:
        """Mutates. The partial group's next chunk of at most `budget` tokens; None (nothing changed)
        when the pool has no room for it."""
        g = self.group
        start = g.kv_len
        written = 0
        token_ids = self.tokens.held_in_common(g.request, g.seq_ids, g.generated)
        if g.kv_len < token_ids.shape[0]:
            chunk = token_ids[g.kv_len:g.kv_len + budget]
            result = self.strategy.extend(g.seq_ids, chunk)
            if not result.admitted:
                return None
            if result.copies is not None and len(result.copies):
                copies.append(result.copies)
            g.kv_len += chunk.shape[0]
            written = chunk.shape[0]
            budget -= written
        prefill = self._close(g, 0, start, written, budget, copies)
        return prefill if prefill.write_tokens else None

    def idle(self, prefills: list[Prefill]) -> tuple[Group, ...]:
        """Pure. The partial group when it computes no chunk this step (`prefills`: the step's), though it holds
        the blocks of those before: a step's unshared block count includes them."""
        g = self.group
        return () if g is None or any(p.request_index == g.index for p in prefills) else (g,)

    def _close(self, g: Group, cached: int, start: int, written: int, budget: int,
               copies: list[np.ndarray]) -> Prefill:
        """Mutates. Once the shared part is complete, a group of several recomputed sequences appends
        their own tokens while the budget and the pool allow; then the step's Prefill."""
        prompt, recomputed = g.request.prompt_tokens, g.generated
        if g.num_seqs > 1 and recomputed and g.kv_len >= prompt:
            done = g.kv_len - prompt
            fit = min(recomputed - done, budget // g.num_seqs)
            while fit and self.strategy.can_append(g.seq_ids):
                self.tokens.append_own(self.strategy, g.seq_ids, done, copies)
                done += 1
                fit -= 1
                written += g.num_seqs
            g.kv_len = prompt + done
        completes = g.kv_len == prompt + recomputed
        g.state = GroupState.STARTING if completes else GroupState.PREFILLING
        self.group = None if completes else g
        return Prefill(g.index, tuple(g.seq_ids), prompt, cached, written, start, g.kv_len, completes)

