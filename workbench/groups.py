"""A request's sequences as one scheduling unit, and the plan of one engine step (docs/engine.md).

Sequences of a group advance in lockstep, so per-group counters describe every member: after a
group's prefill step it has generated one token and holds `prompt` KV rows; each decode step
writes the KV of the token fed back and generates the next, so a decoding group always holds
`kv_len = prompt + generated - 1` rows and finishes with `final_len = prompt + output - 1`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workbench.allocators.base import Snapshot
from workbench.workload.request import VOCAB_SIZE, Request, mix64


def generated_token_ids(keys: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """`token_ids_for(key, offset)` vectorized over pairs: int32 [S] for uint64 keys [S], offsets [S]."""
    with np.errstate(over="ignore"):
        seed = keys.astype(np.uint64) * np.uint64(0x100000001B3)
        return (mix64(offsets.astype(np.uint64) ^ seed) % np.uint64(VOCAB_SIZE)).astype(np.int32)


# STARTING: allocated this step (prefill or swap-in); joins the decode batch at the next step
WAITING, STARTING, RUNNING, SWAPPED, DONE = range(5)


@dataclass(eq=False, slots=True)
class Group:
    index: int  # position in the workload, which is sorted by arrival: smaller = arrived earlier
    request: Request
    final_len: int  # KV rows each sequence holds when the request finishes
    seq_ids: list[int] = field(default_factory=list)
    # While RUNNING these two lag by (completed steps - synced_step): decoding advances every group
    # by one per step, so the scheduler adds the lag only when it needs the values (`_sync`).
    generated: int = 0  # tokens produced by each sequence so far
    kv_len: int = 0  # KV rows written per sequence
    synced_step: int = 0
    epoch: int = 0  # bumped whenever the group stops running; stale finish entries carry an old epoch
    state: int = WAITING

    @property
    def num_seqs(self) -> int:
        return len(self.seq_ids)


@dataclass(slots=True)
class Prefill:
    """A group admitted this step: each sequence's KV rows [cached_tokens, kv_len) are written."""

    group: Group
    cached_tokens: int
    write_tokens: int  # distinct prompt/generated tokens whose KV the step computes


@dataclass(slots=True)
class StepPlan:
    decode_groups: list[Group]  # groups decoding this step, in batch order (valid until `complete`)
    started: list[Group]  # groups swapped back in this step (they decode from the next step)
    decode_ids: list[int]  # their sequences, flattened in the same order
    decode_slots: np.ndarray  # int64 [num_decode]: where each decode sequence's new token goes
    prefills: list[Prefill]
    copies: list[np.ndarray]  # int32 [k, 2] (src_block, dst_block) copy-on-write pairs, in order
    swap_out: list[np.ndarray]  # int32 [k, 2] device -> host block moves, run before everything else
    swap_in: list[np.ndarray]  # int32 [k, 2] host -> device block moves
    forks: list[tuple[int, int]]  # (parent, child) beam forks made when the previous step completed
    preemptions: int
    refused_extent_slots: int
    snapshot: Snapshot
    num_prefill_tokens: int
    kv_read_tokens: int  # KV rows the step's attention reads, summed over sequences
    attn_query_ctx: int  # keys attended, summed over query tokens
    unshared_block_slots: int  # paged: whole-block slots the device sequences would need unshared
    num_running: int  # sequences in the batch: decoding plus prefilled
    copied_blocks: int
    swapped_blocks: int  # moved either way
