"""The values a strategy's verbs take and return (workbench.allocators.base): what a sequence will hold, the
outcome of an admission, an append or a swap, the kernel's view of the tables, the pool's snapshot, a step's
effects beyond its allocations and a prefix match. Plain data: no verb, no state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class _SeqSpecFields(NamedTuple):
    token_ids: np.ndarray | None  # int32 [num_tokens]; None: only the count is given
    final_len: int
    num_new_tokens: int | None
    num_tokens: int  # taken from token_ids when they are given


class SeqSpec(_SeqSpecFields):
    """What a strategy needs to know about a sequence at admission.

    `token_ids` are the tokens whose KV will be written at admission (the prompt, or for a
    recomputed sequence prompt + generated so far), int32 [num_tokens]. `final_len` is the length
    the sequence will reach when it finishes (known from the trace); it splits "reserved" from
    "internal fragmentation" exactly.

    `num_new_tokens` (chunked prefill): the sequences hold only the prefix hit plus at most this many
    of the following tokens (the first chunk, computed in this step), and the rest of `token_ids`
    arrive later through `extend`. The prefix cache is still looked up over all of `token_ids`, once.
    None: they hold all of `token_ids`.

    A strategy that reads no prompt ids (`needs_prompt_ids` False) may be given `token_ids` None and the
    count alone as `num_tokens`: computing a long prompt's ids costs more than admitting it.

    Immutable; a NamedTuple because every admission builds one (a frozen dataclass costs µs to build).
    """

    __slots__ = ()

    def __new__(cls, token_ids: np.ndarray | None, final_len: int, num_new_tokens: int | None = None,
                num_tokens: int = -1):
        if token_ids is not None:
            num_tokens = int(token_ids.shape[0])
        elif num_tokens < 0:
            raise ValueError("a SeqSpec without token ids needs num_tokens")
        if num_new_tokens is not None and num_new_tokens < 1:
            raise ValueError(f"num_new_tokens must be >= 1 (a chunk computes at least one token), got {num_new_tokens}")
        return tuple.__new__(cls, (token_ids, final_len, num_new_tokens, num_tokens))

    def num_held(self, cached_tokens: int) -> int:
        """Tokens the sequences hold after an admission that hit `cached_tokens` in the prefix cache."""
        if self.num_new_tokens is None:
            return self.num_tokens
        return cached_tokens + min(self.num_new_tokens, self.num_tokens - cached_tokens)


class AdmitResult(NamedTuple):
    """Outcome of `admit`, `extend` or `fork` (immutable; a NamedTuple, cheap to build for every admission).

    `copies` order: for `fork`, run them before writing the child's next token (they copy the
    parent's KV). For `admit` and `extend`, they deliver the new tokens' KV from the first sequence of
    the group to the others (contiguous strategies, which cannot share), so run them *after* writing
    the tokens through `slot_mapping(seq_ids[0], ...)`; writing them through every sequence's own slot
    mapping instead is equivalent and makes them redundant.
    """

    admitted: bool
    cached_tokens: int = 0  # leading prompt tokens whose KV is already in the pool (prefix hit)
    copies: np.ndarray | None = None  # int32 [num_copies, 2] (src_block, dst_block)
    needed_extent_slots: int = 0  # on refusal: the contiguous extent the group needed (0 for paged)
    reason: str = ""  # on refusal: why, for logs


class AppendResult(NamedTuple):
    """Outcome of `append` (immutable; a NamedTuple: one is built per step)."""

    slots: np.ndarray  # int64 [num_seqs]: the slot each sequence's new token is written into (layer group 0)
    copies: np.ndarray  # int32 [num_copies, 2] (src_block, dst_block) copy-on-write pairs, run first
    # int64 [num_groups, num_seqs]: each layer group's slot of each new token; None for a pool of one group
    group_slots: np.ndarray | None = None

    def slots_of_group(self, group: int) -> np.ndarray:
        """int64 [num_seqs]: layer group `group`'s slot of each new token."""
        return self.slots if self.group_slots is None else self.group_slots[group]


@dataclass(frozen=True, slots=True)
class SwapResult:
    """Block moves (slot moves for contiguous strategies, whose blocks are slots). A block shared
    inside the swapped group moves once."""

    moves: np.ndarray  # int32 [num_moves, 2] (src_block, dst_block): device→host on out, host→device on in


@dataclass(frozen=True, slots=True)
class PagedDescriptor:
    """FlashInfer's CSR page table for a batch of sequences (docs/kernels.md)."""

    kv_indptr: np.ndarray  # int32 [num_seqs + 1]
    kv_indices: np.ndarray  # int32 [nnz_blocks]
    kv_last_page_len: np.ndarray  # int32 [num_seqs], 1 <= value <= block_size
    block_size: int


@dataclass(frozen=True, slots=True)
class ContiguousDescriptor:
    kv_start: np.ndarray  # int32 [num_seqs], first slot of each extent
    kv_len: np.ndarray  # int32 [num_seqs], tokens written


@dataclass(frozen=True, slots=True)
class GroupSnapshot:
    """One layer group's share of the held pool, in pool slots: token + reserved + internal == held."""

    window_tokens: int | None
    token_slots: int
    reserved_slots: int
    internal_frag_slots: int
    held_slots: int
    # the written slots of the held blocks counted once per sequence holding them (as if no sharing; a window's
    # released blocks are not held), and the held blocks so counted: the step row's `logical_token_slots` and
    # `unshared_block_slots` are the groups' sums
    logical_token_slots: int
    unshared_slots: int

    def __post_init__(self) -> None:
        parts = (self.token_slots, self.reserved_slots, self.internal_frag_slots)
        if min(parts) < 0 or sum(parts) != self.held_slots:
            raise AssertionError(f"group accounting broken: {parts} do not sum to held {self.held_slots}")
        if self.unshared_slots < self.held_slots:
            raise AssertionError(f"group accounting broken: {self.unshared_slots} unshared slots, fewer than the "
                                 f"{self.held_slots} held")


GROUP_PARTS = ("token_slots", "reserved_slots", "internal_frag_slots", "held_slots")  # per-group step columns


class _SnapshotFields(NamedTuple):
    capacity_slots: int
    token_slots: int  # written slots of held blocks; a slot shared by several sequences counts once
    reserved_slots: int  # held, unwritten, and a holder will write it before it reaches its final length
    internal_frag_slots: int  # held and never to be written (over-reservation, block slack, buddy round-up)
    cached_slots: int  # blocks held only by the prefix cache (refcount 0, evictable)
    external_frag_slots: int  # with a refusal: free slots in free extents smaller than the refused extent
    free_slots: int
    logical_token_slots: int  # sum of the on-device sequences' lengths (shared slots counted per sequence)
    # Kernel-facing metadata: 4 bytes per block-table entry (paged: one int32 per entry of each on-device
    # sequence's table, as in kv_indices), 8 bytes per extent (contiguous: int32 kv_start + kv_len).
    block_table_bytes: int
    # The largest request the free space can serve in one piece: the largest free extent (buddy: free
    # buddy block) for contiguous strategies; all free slots for paged ones, whose blocks need no adjacency.
    largest_free_extent_slots: int
    num_free_blocks: int  # blocks a request can get now: free plus evictable cached ones (slots if contiguous)
    # each layer group's split of the held slots (docs/hybrid.md); () for a pool of one group, whose
    # split is the pool's own
    groups: tuple[GroupSnapshot, ...] = ()
    # recurrent state (docs/recurrent.md), the blocks it holds in slots: the live sequences' and the checkpoints'
    state_slots: int = 0
    state_checkpoint_slots: int = 0


class Snapshot(_SnapshotFields):
    """The exact partition of the pool's capacity at one instant (docs/memory.md), in slots.

    token + reserved + internal_frag + cached + external_frag + free + state + state_checkpoint ==
    capacity_slots, all >= 0 (construction fails otherwise; the last two are 0 without recurrent layers).
    Only device memory is counted: a swapped-out sequence appears in no column, not even `logical_token_slots`.

    Immutable; a NamedTuple because every step builds one (a frozen dataclass costs µs to build).
    """

    __slots__ = ()

    def __new__(cls, capacity_slots: int, token_slots: int, reserved_slots: int, internal_frag_slots: int,
                cached_slots: int, external_frag_slots: int, free_slots: int, logical_token_slots: int,
                block_table_bytes: int, largest_free_extent_slots: int, num_free_blocks: int,
                groups: tuple[GroupSnapshot, ...] = (), state_slots: int = 0, state_checkpoint_slots: int = 0):
        parts = (token_slots, reserved_slots, internal_frag_slots, cached_slots, external_frag_slots, free_slots,
                 state_slots, state_checkpoint_slots)
        if sum(parts) != capacity_slots or min(parts) < 0:
            raise AssertionError(f"slot accounting broken: {parts} sum to {sum(parts)}, capacity is {capacity_slots}")
        return tuple.__new__(cls, (capacity_slots, *parts[:6], logical_token_slots, block_table_bytes,
                                   largest_free_extent_slots, num_free_blocks, groups, *parts[6:]))


NO_PAIRS = np.zeros((0, 2), dtype=np.int32)
NO_RANGES = np.zeros((0, 2), dtype=np.int64)


class LayerGroup(NamedTuple):
    """Layers that share one block table (vLLM v1's KV-cache group): a model without sliding-window
    layers is one group of every layer."""

    window_tokens: int  # the layers' sliding window; 0 = full attention
    layer_frac: float  # the group's share of the model's layers


ONE_GROUP = (LayerGroup(0, 1.0),)


class StepEffects(NamedTuple):
    """What a step did to memory beyond its allocations (`Strategy.end_step`), as plain data; the
    neutral value `NO_EFFECTS` is shared (a NamedTuple: one may be built per step)."""

    mapped_pages: int = 0  # physical pages mapped on demand since the last end_step
    unmapped: np.ndarray = NO_RANGES  # int64 [k, 2] slot ranges [start, stop) whose pages were unmapped
    demote: np.ndarray = NO_PAIRS  # int32 [k, 2] (device block, host-tier block): evicted prefix blocks kept
    promote: np.ndarray = NO_PAIRS  # int32 [k, 2] (host-tier block, device block): host-tier hits loaded
    # the fleet's shared tier (`allocators.prefix.shared_port`): this replica's moves in and out of it
    shared_spill: np.ndarray = NO_PAIRS  # int32 [k, 2] (host-tier block, shared block): host-tier drops kept
    shared_demote: np.ndarray = NO_PAIRS  # int32 [k, 2] (device block, shared block): evicted blocks kept
    shared_promote: np.ndarray = NO_PAIRS  # int32 [k, 2] (shared block, device block): shared hits loaded
    columns: tuple[tuple[str, int], ...] = ()  # the strategy's own step columns (name, value), same names each step
    state_copies: int = 0  # recurrent states copied (checkpoints taken and restored, docs/recurrent.md)


NO_EFFECTS = StepEffects()


class PrefixMatch(NamedTuple):
    """What a strategy's own prefix index holds of a prompt now (`Strategy.prefix_match`), as plain data."""

    tokens: int  # leading tokens an admission now would take from the cache: `cached_prompt_tokens`
    # the device tree's nodes the match runs through, root first, as (node id, blocks of the node matched); every
    # node but the last is matched whole. A node created earlier has a smaller id. () without a tree
    path: tuple[tuple[int, int], ...] = ()


NO_MATCH = PrefixMatch(0)


def blocks_refused(need: int, allocatable: int) -> str:
    """The reason a block pool refuses an admission: `need` blocks, fewer `allocatable`."""
    return f"needs {need} blocks, {allocatable} allocatable"
