"""The plan of one engine step: the whole contract from the scheduler to the kernel runner and the clock.

The scheduler builds one `StepPlan` per step after it has made every allocation decision; the
kernel runner executes it on the KV pool (block moves, cache writes, attention) and never asks the
strategy or the scheduler for anything else. Kernel inputs (token ids, slot mappings, descriptors)
are filled in only when a kernel consumes the step, so a run without kernels pays nothing for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from workbench.allocators.base import ContiguousDescriptor, PagedDescriptor, Snapshot
from workbench.groups import Group
from workbench.step_cost import StepCost

NO_PAIRS = np.zeros((0, 2), dtype=np.int32)
NO_SLOTS = np.zeros(0, dtype=np.int64)
NO_RANGES = np.zeros((0, 2), dtype=np.int64)
Descriptor = PagedDescriptor | ContiguousDescriptor


@dataclass(frozen=True, slots=True)
class Prefill:
    """Prefill work of one group this step: each sequence's KV rows [start, stop) are written. Without
    chunked prefill a group is admitted and prefilled whole in one step (start = cached_tokens, stop =
    its kv_len); with it, one step computes one chunk and only the last chunk produces a token."""

    group: Group
    cached_tokens: int  # prefix-cache hit counted at admission (0 for a later chunk)
    write_tokens: int  # distinct prompt/generated tokens whose KV the step computes
    start: int
    stop: int
    completes: bool  # the group's prefill ends this step: it produces its first token and decodes next


@dataclass(frozen=True, slots=True)
class SeqWrite:
    """An admitted sequence's KV rows [start, stop) go into `slots`; its extend attention has queries at
    positions [query_start, stop) (none when query_start == stop: a sample whose prompt another
    sample of its group computes)."""

    seq_id: int
    start: int
    stop: int
    query_start: int
    slots: np.ndarray  # int64 [stop - start]


@dataclass(frozen=True, slots=True)
class GroupKernelInputs:
    """One layer group of a hybrid pool (docs/hybrid.md) at one step: its own slots and tables."""

    window_tokens: int  # sliding window of the group's layers; 0 = full attention
    layer_frac: float  # the group's share of the model's layers (weights its measured attention time)
    write_slots: tuple[np.ndarray, ...]  # int64 [stop - start] for each of KernelInputs.writes, same order
    decode_slots: np.ndarray  # int64 [num_decode]
    decode_desc: Descriptor | None  # attention steps only, as in KernelInputs
    extend_desc: Descriptor | None


@dataclass(frozen=True, slots=True)
class KernelInputs:
    """What the kernel runner needs beyond the plan's block moves, for one step."""

    writes: tuple[SeqWrite, ...]  # admitted sequences, group by group
    decode_seq_ids: np.ndarray  # int64 [num_decode], batch order
    decode_positions: np.ndarray  # int64 [num_decode]: position of the token each one writes
    decode_token_ids: np.ndarray  # int32 [num_decode]: the id of that token
    attention: bool  # whether attention runs at this step (every `kernel_every` steps)
    # attention steps only (None otherwise): the kernels' view of the decode batch, and of the
    # sequences of `writes` that have queries, in that order
    decode_desc: Descriptor | None
    extend_desc: Descriptor | None
    # a hybrid pool's layer groups, each run over its own table (then `decode_desc`, `extend_desc` are None
    # and the plan's `decode_slots` and the writes' `slots` are group 0's); () for one table per sequence
    groups: tuple[GroupKernelInputs, ...] = ()


class StepPlan(NamedTuple):
    """Immutable (a NamedTuple: one is built per step, and a frozen dataclass costs several µs to build)."""

    step: int
    decode_groups: tuple[Group, ...]  # groups decoding this step, batch order (valid until `complete`)
    started: tuple[Group, ...]  # groups swapped back in this step (they decode from the next step)
    prefills: tuple[Prefill, ...]
    decode_slots: np.ndarray  # int64 [num_decode]: where each decode sequence's new token goes
    # block moves, executed in this order before any write: swap-outs, swap-ins, copies
    swap_out: np.ndarray  # int32 [k, 2] (device block, host block)
    swap_in: np.ndarray  # int32 [k, 2] (host block, device block)
    copies: np.ndarray  # int32 [k, 2] (src block, dst block): copy-on-write and prompt copies
    forks: tuple[tuple[int, int], ...]  # (parent, child) beam forks made when the previous step completed
    preemptions: int
    refused_extent_slots: int
    snapshot: Snapshot  # the §3 accounting once the step's allocations are made
    cost: StepCost
    kernel: KernelInputs | None  # None when no kernel runs in this simulation
    # int64 [k, 2] slot ranges [start, stop) whose physical pages the strategy unmapped since the last
    # plan (strategies mapping pages on demand): released in the pool after the swap-outs, before the rest
    unmapped: np.ndarray = NO_RANGES
    # a prefix cache's host tier (allocators.host_tier), executed after the swap-outs and before the
    # swap-ins: demotes first (each reads its device block before anything of the step writes it), then promotes
    demote: np.ndarray = NO_PAIRS  # int32 [k, 2] (device block, host-tier block)
    promote: np.ndarray = NO_PAIRS  # int32 [k, 2] (host-tier block, device block)
