"""What one step computes and moves, for the clock and the step row (workbench.clock.roofline, results).

Decode-side totals are kept in O(1) per step: a running group's kv_len is v + (completed steps) for
a fixed v, so the sum of kv_len grows by the batch size each step, and the group's block count grows
at the step where (v + completed steps) % block_size == 0; `_crossing[r]` counts the decoding
sequences with v % block_size == r, so the blocks gained in one step are one lookup.

Sliding-window layers (docs/hybrid.md) read at most W keys per query: with `windows` (W, fraction of
the model's layers) the attention totals (`kv_read_tokens`, `attn_query_ctx`, `decode_ctx_tokens`)
are averaged over layers, a window layer counting min(context, W) (`_WindowSums` keeps the decode
side's sum of min(kv_len, W) in O(1) per step). Without windows they are the plain integer totals.

Sparse attention (DeepSeek Sparse Attention) comes as two terms (`workbench.presets.AttentionTerm`): each
query reads and attends its top min(context, k) latent rows, like a window of k, and the indexer reads and
scores every key, like full attention, each weighted by its share of a key's bytes and of attention's FLOPs
per key. A prefill chunk's queries may select any of the context's keys, so its reads are
min(context, k × queries) for the top-k term (a window's are the chunk's keys plus the W − 1 before it).
`decode_ctx_tokens` is then the read-weighted total.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from workbench.intmath import cdiv
from workbench.presets import AttentionTerm


def query_keys(start, stop):
    """Keys attended by one sequence's queries at positions [start, stop) under causal attention: the query at
    position q attends the q + 1 keys 0..q (integers, or arrays of them). The general loop's `CostMeter` and the
    verify step of speculative decoding take their attention totals from it, the compiled step loop from its
    compiled twin (workbench.engine.compiled_rules); written in what numba compiles."""
    return (stop * (stop + 1) - start * (start + 1)) // 2


class StepCost(NamedTuple):
    """Immutable; a NamedTuple because one is built per step (a frozen dataclass costs µs to build)."""

    num_prefill_tokens: int  # prompt / recomputed tokens whose KV the step computes
    num_decode_tokens: int
    kv_read_tokens: float  # KV rows the step's attention reads, summed over sequences (averaged over layers)
    attn_query_ctx: float  # keys attended, summed over query tokens (averaged over layers)
    decode_ctx_tokens: float  # the decoding sequences' share of both: each reads and attends its kv_len
    unshared_block_slots: int  # whole-block slots the device sequences would need without sharing
    num_running: int  # sequences in the batch: decoding plus prefilled
    copied_blocks: int
    swapped_blocks: int  # moved either way
    mapped_pages: int = 0  # physical pages mapped on demand (virtual-memory strategies; 0 for the others)
    decode_blocks: int = 0  # KV blocks the decoding sequences' attention reads, summed over sequences
    loaded_blocks: int = 0  # prefix blocks promoted from a host tier (host -> device over the host link)
    shared_loaded_blocks: int = 0  # prefix blocks copied in from a fleet's shared tier (over the shared link)
    # rows through the output layer: each decoding sequence and each sequence whose prefill ends this step
    # (None: a StepCost built by hand; the clock takes the decode rows and one prompt row)
    sampled_tokens: int | None = None
    # speculative decoding's draft model (EAGLE, MTP): passes proposing one token each for `draft_rows`
    # sequences whose contexts total `draft_ctx_tokens` rows (workbench.clock.roofline.RooflineClock.draft_s)
    draft_passes: int = 0
    draft_rows: int = 0
    draft_ctx_tokens: int = 0
    state_copies: int = 0  # recurrent states copied: checkpoints taken and restored (docs/recurrent.md)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens


class CostMeter:
    """Running totals over the decoding sequences. Every method but `cost` mutates."""

    def __init__(self, block_size: int, windows: tuple[tuple, ...] = ()) -> None:
        """`windows`: (window tokens, fraction of the layers) of the model's sliding-window layer groups, or a
        sparse-attention model's `AttentionTerm`s (`ModelPreset.window_layer_fracs`)."""
        self.block_size = block_size
        self._decode_ctx = 0  # sum of kv_len
        self._unshared_blocks = 0  # sum of ceil(kv_len / block_size)
        self._crossing = [0] * block_size
        terms = [AttentionTerm(*t) if len(t) > 2 else AttentionTerm(t[0], t[1], t[1]) for t in windows]
        capped = [t for t in terms if t.cap_tokens is not None]
        full = [t for t in terms if t.cap_tokens is None]
        self._windows = [(_WindowSums(t.cap_tokens), t.read_frac) for t in capped]
        # (sums, read share, FLOP share, sparse) of each capped term
        self._terms = [(sums, t.read_frac, t.flop_frac, t.sparse) for (sums, _), t in zip(self._windows, capped,
                                                                                         strict=True)]
        # the share reading every key: the layers outside every window, or a term of its own
        self._full_frac = sum(t.read_frac for t in full) if full else 1.0 - sum(t.read_frac for t in capped)
        self._full_flop_frac = (sum(t.flop_frac for t in full) if full
                                else 1.0 - sum(t.flop_frac for t in capped))

    def add(self, kv_len: int, n: int, step: int, sign: int) -> None:
        """Add (+1) or remove (-1) a synced running group of `n` sequences holding `kv_len` rows each at `step`."""
        bs = self.block_size
        self._decode_ctx += sign * kv_len * n
        self._unshared_blocks += sign * cdiv(kv_len, bs) * n
        self._crossing[(kv_len - step) % bs] += sign * n
        for sums, _ in self._windows:
            sums.add(kv_len, n, step, sign)

    def decoded(self, num_decode: int, step: int) -> None:
        """Every decoding sequence appended one token at `step`."""
        self._decode_ctx += num_decode
        self._unshared_blocks += self._crossing[-step % self.block_size]
        for sums, _ in self._windows:
            sums.decoded(step)

    def cost(self, num_decode: int, prefills, started, copied_blocks: int,
             swapped_blocks: int, mapped_pages: int = 0) -> StepCost:
        """The step's totals: the decode batch (already counted by `decoded`), then each group's
        prefill work of this step (`workbench.engine.plan.Prefill`: a whole prompt or one chunk) and each group
        in `started` (num_seqs, kv_len): swapped back in, or a partial prefill that holds its chunks so far and
        computes none this step."""
        bs = self.block_size
        kv_read = attn_ctx = self._decode_ctx
        unshared = self._unshared_blocks * bs
        num_prefill = 0
        num_running = sampled = num_decode
        for p in prefills:
            n = p.num_seqs
            num_prefill += p.write_tokens
            if p.completes:
                sampled += n
            kv_read += p.stop * n
            unshared += n * cdiv(p.stop, bs) * bs
            num_running += n
            attn_ctx += query_keys(p.start, p.stop)
        for g in started:  # swapped back in (or a partial prefill without a chunk): holding blocks, not computing
            unshared += g.num_seqs * cdiv(g.kv_len, bs) * bs
        if self._windows:
            return self._windowed(num_prefill, num_decode, prefills, unshared, num_running, copied_blocks,
                                  swapped_blocks, mapped_pages, sampled)
        # positional: built once per step, and keywords cost a NamedTuple half its construction time
        return StepCost(num_prefill, num_decode, kv_read, attn_ctx, self._decode_ctx, unshared, num_running,
                        copied_blocks, swapped_blocks, mapped_pages, self._unshared_blocks, 0, 0, sampled)

    def _windowed(self, num_prefill: int, num_decode: int, prefills, unshared: int, num_running: int,
                  copied_blocks: int, swapped_blocks: int, mapped_pages: int, sampled: int) -> StepCost:
        """`cost` with window layers charged min(context, W) keys: the attention totals averaged over layers."""
        full, full_flops, terms = self._full_frac, self._full_flop_frac, self._terms
        decode = full * self._decode_ctx + sum(frac * sums.total() for sums, frac in self._windows)
        kv_read = decode
        attn_ctx = full_flops * self._decode_ctx + sum(f * sums.total() for sums, _, f, _ in terms)
        for p in prefills:
            n = p.num_seqs
            kv_read += n * (full * p.stop + sum(frac * _prefill_reads(p.start, p.stop, sums.window, sparse)
                                                for sums, frac, _, sparse in terms))
            attn_ctx += full_flops * _capped_sum(p.start + 1, p.stop, None) + sum(
                f * _capped_sum(p.start + 1, p.stop, sums.window) for sums, _, f, _ in terms)
        return StepCost(num_prefill, num_decode, kv_read, attn_ctx, decode, unshared, num_running, copied_blocks,
                        swapped_blocks, mapped_pages, self._unshared_blocks, 0, 0, sampled)


def _prefill_reads(start: int, stop: int, cap: int, sparse: bool) -> int:
    """Keys a prefill of positions [start, stop) reads from a term capped at `cap`: a window's span (the
    chunk's keys and the cap − 1 before it), or for top-k any min(stop, cap × queries) of the context."""
    if sparse:
        return min(stop, cap * (stop - start))
    return stop - max(0, start - cap + 1)


def _capped_sum(first: int, last: int, cap: int | None) -> int:
    """sum of min(x, cap) for x in [first, last] (0 when empty; cap None: no cap): the keys queries at
    positions first − 1 .. last − 1 attend."""
    if last < first:
        return 0
    top = last if cap is None else min(last, cap)
    below = query_keys(first - 1, top) if top >= first else 0
    return below + (0 if cap is None else cap * max(0, last - max(first - 1, cap)))


class _WindowSums:
    """Sum of min(kv_len, W) over the decoding sequences in O(1) per step: a sequence below W grows by one
    per decode step until a step known when it joins, then stays at W."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._below_sum = 0  # sum of kv_len of the sequences below W
        self._below = 0  # how many
        self._capped = 0  # sequences at W or more
        self._reach: dict[int, int] = {}  # step -> sequences whose kv_len reaches W in that step's decode

    def add(self, kv_len: int, n: int, step: int, sign: int) -> None:
        """Add (+1) or remove (-1) n sequences of a group whose kv_len is current at `step`."""
        if kv_len >= self.window:
            self._capped += sign * n
            return
        self._below_sum += sign * n * kv_len
        self._below += sign * n
        at = step + self.window - kv_len - 1  # the same step whenever a running group is added or removed
        self._reach[at] = self._reach.get(at, 0) + sign * n

    def decoded(self, step: int) -> None:
        self._below_sum += self._below
        n = self._reach.pop(step, 0)
        self._below_sum -= n * self.window
        self._below -= n
        self._capped += n

    def total(self) -> int:
        return self._below_sum + self.window * self._capped


def with_drafts(cost: StepCost, ctx: np.ndarray, drafts: np.ndarray, block_size: int, draft_model: bool) -> StepCost:
    """A decode step's cost as a verify step (workbench.engine.speculation): each decoding sequence, holding
    ctx[i] rows with its last token's, also writes and verifies drafts[i] draft tokens, whose queries attend
    ctx[i] + 1 .. ctx[i] + drafts[i] keys, and passes every row through the output layer; with a draft model
    (`draft_model`) the draft proposed them first in max(drafts) passes over the drafting sequences. Full
    attention only (the engine refuses speculation for window and sparse layers)."""
    d = int(drafts.sum())
    if not d:
        return cost
    attended = int(query_keys(ctx, ctx + drafts).sum())
    more_blocks = int((cdiv(ctx + drafts, block_size) - cdiv(ctx, block_size)).sum())
    drafting = drafts > 0
    passes = int(drafts.max()) if draft_model else 0
    return cost._replace(
        num_decode_tokens=cost.num_decode_tokens + d, kv_read_tokens=cost.kv_read_tokens + d,
        attn_query_ctx=cost.attn_query_ctx + attended,
        decode_ctx_tokens=cost.decode_ctx_tokens + d, decode_blocks=cost.decode_blocks + more_blocks,
        unshared_block_slots=cost.unshared_block_slots + more_blocks * block_size,
        sampled_tokens=(cost.sampled_tokens or 0) + d, draft_passes=passes,
        draft_rows=int(np.count_nonzero(drafting)) if passes else 0,
        draft_ctx_tokens=int(ctx[drafting].sum()) if passes else 0)
