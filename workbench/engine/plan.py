"""The plan of one engine step: the whole contract from the scheduler to the kernel runner and the clock.

The scheduler builds one `StepPlan` per step after it has made every allocation decision; the
kernel runner executes it on the KV pool (block moves, cache writes, attention) and never asks the
strategy or the scheduler for anything else. It carries plain data (ids, counts, arrays), never live
scheduler objects, so it can be logged, compared or sent elsewhere. Kernel inputs (token ids, slot
mappings, descriptors) are filled in only when a kernel consumes the step, so a run without kernels
pays nothing for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from workbench.allocators.values import (
    NO_EFFECTS,
    NO_PAIRS,
    AppendResult,
    ContiguousDescriptor,
    PagedDescriptor,
    Snapshot,
    StepEffects,
)
from workbench.clock.step_cost import StepCost

NO_SLOTS = np.zeros(0, dtype=np.int64)
Descriptor = PagedDescriptor | ContiguousDescriptor


@dataclass(frozen=True, slots=True)
class Prefill:
    """Prefill work of one group this step: each sequence's KV rows [start, stop) are written. Without
    chunked prefill a group is admitted and prefilled whole in one step (start = cached_tokens, stop =
    its kv_len); with it, one step computes one chunk and only the last chunk produces a token."""

    request_index: int  # the group's request: its position in the workload
    seq_ids: tuple[int, ...]  # the group's sequences; the first computes the shared prompt
    prompt_tokens: int
    cached_tokens: int  # prefix-cache hit counted at admission (0 for a later chunk)
    write_tokens: int  # distinct prompt/generated tokens whose KV the step computes
    start: int
    stop: int
    completes: bool  # the group's prefill ends this step: it produces its first token and decodes next

    @property
    def num_seqs(self) -> int:
        return len(self.seq_ids)


class Resumed(NamedTuple):
    """A group swapped back in this step: it holds `kv_len` rows per sequence and decodes from the next step."""

    request_index: int
    num_seqs: int
    kv_len: int


@dataclass(frozen=True, slots=True)
class Landed:
    """A request whose prompt KV a prefill replica computed and shipped here (disaggregated prefill/decode,
    docs/fleet.md), admitted this step: its one sequence's rows [cached_tokens, kv_len) are written from the
    transferred copy and nothing is computed for it; like a swapped-in group it decodes from the next step
    (it is also one of the plan's `started`)."""

    request_index: int
    seq_id: int
    cached_tokens: int  # prompt tokens the replica's own prefix cache held already (not written again)
    kv_len: int  # the prompt


@dataclass(frozen=True, slots=True)
class SeqWrite:
    """An admitted sequence's KV rows [start, stop) are written (into each layer group's slots,
    `GroupKernelInputs.write_slots`); its extend attention has queries at positions [query_start, stop)
    (none when query_start == stop: a sample whose prompt another sample of its group computes)."""

    seq_id: int
    start: int
    stop: int
    query_start: int


@dataclass(frozen=True, slots=True)
class GroupKernelInputs:
    """One layer group's slots and tables at one step (a pool of one group has one of these)."""

    window_tokens: int  # sliding window of the group's layers; 0 = full attention
    layer_frac: float  # the group's share of the model's layers (weights its measured attention time)
    write_slots: tuple[np.ndarray, ...]  # int64 [stop - start] for each of KernelInputs.writes, same order
    decode_slots: np.ndarray  # int64 [num_decode]: where each decode sequence's new token goes
    # attention steps only (None otherwise): the kernels' view of the decode batch, and of the
    # sequences of `writes` that have queries, in that order
    decode_desc: Descriptor | None
    extend_desc: Descriptor | None


@dataclass(frozen=True, slots=True)
class KernelInputs:
    """What the kernel runner needs beyond the plan's block moves, for one step."""

    writes: tuple[SeqWrite, ...]  # admitted sequences, group by group
    decode_seq_ids: np.ndarray  # int64 [num_decode], batch order
    decode_positions: np.ndarray  # int64 [num_decode]: position of the token each one writes
    decode_token_ids: np.ndarray  # int32 [num_decode]: the id of that token
    attention: bool  # whether attention runs at this step (every `kernel_every` steps)
    groups: tuple[GroupKernelInputs, ...]  # one per layer group of the pool (Strategy.layer_groups)


class StepPlan(NamedTuple):
    """Plain data only, immutable (a NamedTuple: one is built per step, and a frozen dataclass costs
    several µs to build)."""

    step: int
    decode_requests: tuple[int, ...]  # request index of each group decoding this step, batch order
    started: tuple[Resumed, ...]  # groups swapped back in this step, and those of `landed`
    prefills: tuple[Prefill, ...]
    # block moves, executed in this order before any write: swap-outs, (effects.unmapped released,
    # effects.shared_spill, .demote, .shared_demote, .promote, .shared_promote), swap-ins, copies
    swap_out: np.ndarray  # int32 [k, 2] (device block, host block)
    swap_in: np.ndarray  # int32 [k, 2] (host block, device block)
    copies: np.ndarray  # int32 [k, 2] (src block, dst block): copy-on-write and prompt copies
    forks: tuple[tuple[int, int], ...]  # (parent, child) beam forks made when the previous step completed
    preemptions: int
    refused_extent_slots: int
    snapshot: Snapshot  # the §3 accounting once the step's allocations are made
    cost: StepCost
    kernel: KernelInputs | None  # None when no kernel runs in this simulation
    # the strategy's `end_step`: pages mapped and unmapped (unmapped ranges are released in the pool after
    # the swap-outs, before the rest), a host tier's demotes (each reads its device block before anything of
    # the step writes it) and promotes, the same for the fleet's shared tier, and the strategy's own step columns
    effects: StepEffects = NO_EFFECTS
    landed: tuple[Landed, ...] = ()  # requests whose transferred prompt KV is admitted this step
    # the engine's own step columns (speculative decoding's), the same names every step
    columns: tuple[tuple[str, int], ...] = ()


class Verify(NamedTuple):
    """Speculative decoding's verify step (workbench.engine.speculation), from the batch's slots to `complete`:
    per decoding sequence (batch order, one per group) its draft tokens, how many of them are accepted, and
    its context once its last token is written (the first draft's position), int64 [num_decode] each."""

    ids: list[int]
    requests: np.ndarray  # each sequence's request (its workload index)
    drafts: np.ndarray
    accepted: np.ndarray
    ctx: np.ndarray
    first_generated: np.ndarray  # the index among its generated tokens of each sequence's first draft


class GrownBatch:
    """The decode batch of a step once it has its slots (`Scheduler._grow_batch`, mutated there): the decoding sequences
    (batch order); with token ids the same as an array, the position each writes and its token; the append."""

    __slots__ = ("ids", "seq_ids", "positions", "token_ids", "appended", "preemptions")

    def __init__(self, ids: list[int], preemptions: int = 0) -> None:
        self.ids = ids
        self.seq_ids = self.positions = self.token_ids = None
        self.appended: AppendResult | None = None
        self.preemptions = preemptions


class Admitted:
    """What a step admits beside its decodes (`Scheduler._admit`): groups swapped back in or landed, prefills,
    landed prompts, the swap-ins' block pairs and the extent refused to the first group that did not fit."""

    __slots__ = ("started", "prefills", "landed", "swap_in", "refused_extent")

    def __init__(self) -> None:
        self.started: list[Resumed] = []
        self.prefills: list[Prefill] = []
        self.landed: list[Landed] = []
        self.swap_in = NO_PAIRS
        self.refused_extent = 0


NOTHING_ADMITTED = Admitted()  # read only: a decode-only step's


def concat_pairs(parts: list[np.ndarray]) -> np.ndarray:
    """Pair arrays int32 [k_i, 2] as one int32 [sum k_i, 2], in order."""
    if not parts:
        return NO_PAIRS
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
