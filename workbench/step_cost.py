"""What one step computes and moves, for the clock and the step row (workbench.clock, results).

Decode-side totals are kept in O(1) per step: a running group's kv_len is v + (completed steps) for
a fixed v, so the sum of kv_len grows by the batch size each step, and the group's block count grows
at the step where (v + completed steps) % block_size == 0; `_crossing[r]` counts the decoding
sequences with v % block_size == r, so the blocks gained in one step are one lookup.
"""

from __future__ import annotations

from typing import NamedTuple

from workbench.groups import Group
from workbench.intmath import cdiv


class StepCost(NamedTuple):
    """Immutable; a NamedTuple because one is built per step (a frozen dataclass costs µs to build)."""

    num_prefill_tokens: int  # prompt / recomputed tokens whose KV the step computes
    num_decode_tokens: int
    kv_read_tokens: int  # KV rows the step's attention reads, summed over sequences
    attn_query_ctx: int  # keys attended, summed over query tokens
    decode_ctx_tokens: int  # the decoding sequences' share of both: each reads and attends its kv_len
    unshared_block_slots: int  # whole-block slots the device sequences would need without sharing
    num_running: int  # sequences in the batch: decoding plus prefilled
    copied_blocks: int
    swapped_blocks: int  # moved either way
    mapped_pages: int = 0  # physical pages mapped on demand (virtual-memory strategies; 0 for the others)
    loaded_blocks: int = 0  # prefix blocks promoted from a host tier (host -> device over the host link)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens


class CostMeter:
    """Running totals over the decoding sequences. Every method but `cost` mutates."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._decode_ctx = 0  # sum of kv_len
        self._unshared_blocks = 0  # sum of ceil(kv_len / block_size)
        self._crossing = [0] * block_size

    def add(self, g: Group, step: int, sign: int) -> None:
        """Add (+1) or remove (-1) a synced running group (its kv_len is current at `step`)."""
        n, bs = g.num_seqs, self.block_size
        self._decode_ctx += sign * g.kv_len * n
        self._unshared_blocks += sign * cdiv(g.kv_len, bs) * n
        self._crossing[(g.kv_len - step) % bs] += sign * n

    def decoded(self, num_decode: int, step: int) -> None:
        """Every decoding sequence appended one token at `step`."""
        self._decode_ctx += num_decode
        self._unshared_blocks += self._crossing[-step % self.block_size]

    def cost(self, num_decode: int, prefills, started: list[Group], copied_blocks: int,
             swapped_blocks: int, mapped_pages: int = 0) -> StepCost:
        """The step's totals: the decode batch (already counted by `decoded`), then each group's
        prefill work of this step (`workbench.plan.Prefill`: a whole prompt or one chunk) and each group
        swapped back in."""
        bs = self.block_size
        kv_read = attn_ctx = self._decode_ctx
        unshared = self._unshared_blocks * bs
        num_prefill = 0
        num_running = num_decode
        for p in prefills:
            n = p.group.num_seqs
            num_prefill += p.write_tokens
            kv_read += p.stop * n
            unshared += n * cdiv(p.stop, bs) * bs
            num_running += n
            # queries at positions [start, stop) attend to positions 0..q: the sum of (q + 1)
            attn_ctx += (p.stop * (p.stop + 1) - p.start * (p.start + 1)) // 2
        for g in started:  # swapped back in: holding blocks, computing from the next step
            unshared += g.num_seqs * cdiv(g.kv_len, bs) * bs
        # positional: built once per step, and keywords cost a NamedTuple half its construction time
        return StepCost(num_prefill, num_decode, kv_read, attn_ctx, self._decode_ctx, unshared, num_running,
                        copied_blocks, swapped_blocks, mapped_pages)
