"""The strategy protocol: the whole interface between the scheduler/engine and a KV allocator.

Strategies own integers only (block ids, extents, reference counts). They never touch device
memory: copy-on-write and swaps come back as (src, dst) block pairs that the engine executes with
the cache kernels. Every slot of the pool is addressed as `block_id × block_size + offset`;
contiguous strategies use `block_size == 1`, so a slot is a block.

Verbs that mutate state say so in their docstring; everything else is a pure query.

Optional capabilities (layer groups, pages mapped on demand, a host tier, a shared tier) are members of the protocol
with neutral defaults, so the scheduler and the engine never ask what kind of strategy they hold; what
a step did beyond its allocations comes back from `end_step` as plain data.

Sequence lengths: a sequence never holds more than `SeqSpec.final_len` tokens. `append` past it is a
caller error (ValueError), and so is a `final_len` above the strategy's `max_model_len`: the engine
rejects such requests before admission. Knowing the final length is what splits "reserved" from
"internal fragmentation" exactly (docs/memory.md).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

KernelMode = Literal["paged", "contiguous"]


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
    logical_token_slots: int  # units × the on-device sequences' lengths (as if no window and no sharing)

    def __post_init__(self) -> None:
        parts = (self.token_slots, self.reserved_slots, self.internal_frag_slots)
        if min(parts) < 0 or sum(parts) != self.held_slots:
            raise AssertionError(f"group accounting broken: {parts} do not sum to held {self.held_slots}")


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


class Strategy(ABC):
    """A KV allocation strategy. Sequences are named by the caller's integer ids. A strategy class
    subclasses this one; the abstract verbs are its whole duty, and every optional capability below
    has the neutral value of a strategy without it."""

    name: str
    kernel_mode: KernelMode
    block_size: int  # slots per block; 1 for contiguous strategies
    capacity_slots: int  # whole blocks only: the pool's C of docs/memory.md (a tail smaller than a block is not pool)
    supports_swap: bool  # False: swap_out raises and the engine must preempt by recompute
    # True: a sequence takes fixed-size blocks from one shared pool as it grows (paged), so admission keeps a
    # watermark of free blocks for the running ones, bounds a readmitted group's appends before admitting it,
    # and a step row's unshared slots are whole blocks; False: a sequence's memory is its own extent
    grows_by_blocks: bool = False
    wants_token_ids: bool = False  # True: `append` uses the new tokens' ids (prefix caching of decode-filled blocks)
    needs_prompt_ids: bool = True  # False: `admit` reads only the count of `SeqSpec.token_ids` (may be given None)
    prefix_query_tokens: int = 0  # prompt tokens looked up in the prefix cache by this instance (0 without one)
    prefix_hit_tokens: int = 0  # of those, tokens served from the cache
    prefix_evicted_blocks: int = 0  # cached blocks evicted (unregistered and reused) by this instance

    def compiled_pool(self):
        """This strategy's own arrays lent to a compiled step loop that can run it through a whole run from its
        present state (workbench.allocators.paged.compiled_pool.CompiledPool for
        workbench.engine.compiled_paged), or None: the general loop runs it."""
        return None

    @property
    def kernel_reads_blocks(self) -> bool:
        """The attention kernel walks a block table (each block visit has its own cost in the clock), rather
        than reading each sequence's KV as one extent."""
        return self.kernel_mode == "paged"

    @abstractmethod
    def admit(self, seq_ids: list[int], spec: SeqSpec) -> AdmitResult:
        """Mutates. Admit a group of sequences that share one prompt (n >= 1), all or nothing.

        On success every sequence holds the prompt's `spec.num_tokens` tokens (shared where the
        strategy can share), the KV of all but the first `cached_tokens` must be written by the
        engine via `slot_mapping`. On refusal nothing changes."""
        ...

    @abstractmethod
    def can_append(self, seq_ids: list[int]) -> bool:
        """Whether `append(seq_ids)` would succeed now."""
        ...

    @abstractmethod
    def append(self, seq_ids: list[int], token_ids: np.ndarray | None = None) -> AppendResult:
        """Mutates. Give each sequence one more token slot (a decode step), in batch order. Raises
        RuntimeError, changing nothing, when the pool cannot (check `can_append` first), and
        ValueError for a repeated, swapped-out or finished (length == final_len) sequence.

        `token_ids` (int32 [num_seqs]) are the ids of the tokens written into those slots. Only a
        strategy with `wants_token_ids` uses them (to cache blocks filled during decode); callers
        may pass None, and then such a strategy stops caching these sequences' later blocks."""
        ...

    def append_if_room(self, seq_ids: list[int], token_ids: np.ndarray | None = None) -> AppendResult | None:
        """Mutates when it returns a result: `append` if `can_append`, else None and nothing changes (the
        scheduler's one call per decode step; a strategy that counts the step's blocks once overrides it)."""
        if not self.can_append(seq_ids):
            return None
        return self.append(seq_ids) if token_ids is None else self.append(seq_ids, token_ids)

    # ---- speculative decoding (workbench.engine.speculation) ------------------------------------
    supports_drafts: bool = False  # True: `append_with_drafts` and `settle_drafts` work (`_drop_tail` exists)

    def append_with_drafts(self, seq_ids: list[int], token_ids: np.ndarray | None,
                           num_drafts: np.ndarray) -> AppendResult | None:
        """Mutates when it returns a result. A speculative step's slots, all or nothing: each sequence gets the
        slot of its last token (as `append_if_room`, with `token_ids` as there) and then `num_drafts[i]` more
        (int64 [num_seqs]) for unverified draft tokens; None, nothing changed, when the pool cannot supply them
        all. Until `settle_drafts` no prefix index sees a draft slot. The result's slots are the last tokens';
        its copies are the whole step's. This default suits a strategy that registers nothing on append: it
        appends round by round and gives everything back (`_drop_tail`) when a round finds no room."""
        appended = self.append_if_room(seq_ids, token_ids)
        if appended is None:
            return None
        copies, taken = [appended.copies], np.ones(len(seq_ids), dtype=np.int64)
        for j in range(1, int(num_drafts.max(initial=0)) + 1):
            drafting = num_drafts >= j
            more = self.append_if_room([s for s, d in zip(seq_ids, drafting.tolist(), strict=True) if d])
            if more is None:
                self._drop_tail(seq_ids, taken)
                return None
            copies.append(more.copies)
            taken += drafting
        return AppendResult(slots=appended.slots, copies=np.concatenate(copies) if len(copies) > 1 else copies[0])

    def settle_drafts(self, seq_ids: list[int], num_drafts: np.ndarray, accepted: np.ndarray,
                      token_ids: np.ndarray | None) -> None:
        """Mutates. After the verify step of `append_with_drafts(seq_ids, ..., num_drafts)`: each sequence keeps
        the first `accepted[i]` of its draft slots, whose tokens are now verified (`token_ids`: their ids,
        int32, sequence by sequence, for a strategy with `wants_token_ids`; a prefix cache registers the blocks
        they fill), and gives back the rest: a paged strategy returns the blocks that become empty, a contiguous
        one keeps its reservation."""
        del token_ids  # nothing registers here
        self._drop_tail(seq_ids, num_drafts - accepted)

    def _drop_tail(self, seq_ids: list[int], num_slots: np.ndarray) -> None:
        """Mutates. Each sequence gives back its last `num_slots[i]` slots, appended since its last verified
        token (draft slots)."""
        raise NotImplementedError(f"{type(self).__name__} does not support speculative decoding")

    @abstractmethod
    def extend(self, seq_ids: list[int], token_ids: np.ndarray) -> AdmitResult:
        """Mutates on success. Chunked prefill: the group admitted together by one `admit` with
        `SeqSpec.num_new_tokens` (and neither appended to, forked nor swapped since) holds the next
        `token_ids` (int32 [num_tokens]) of its prompt too, shared as admission shares the prompt; a
        prefix cache registers the blocks they fill, exactly as an admission of the whole prompt
        would have. Refused (admitted False, nothing changed) when the pool cannot supply the slots;
        ValueError past `final_len` or for sequences that do not form such a group."""
        ...

    @abstractmethod
    def fork(self, parent_id: int, child_id: int) -> AdmitResult:
        """Mutates. The child gets the parent's tokens (shared by reference count where possible)."""
        ...

    @abstractmethod
    def free(self, seq_id: int) -> None:
        """Mutates. Release the sequence; its blocks return to the pool (or the prefix cache)."""
        ...

    @abstractmethod
    def slot_mapping(self, seq_id: int, start: int, stop: int) -> np.ndarray:
        """Slots of token positions [start, stop) of the sequence, int64 [stop - start]."""
        ...

    @abstractmethod
    def describe(self, seq_ids: list[int]) -> PagedDescriptor | ContiguousDescriptor:
        """The kernel's view of these sequences, in this order."""
        ...

    @abstractmethod
    def num_allocatable_blocks(self) -> int:
        """Blocks a request can get now: free plus evictable cached ones (slots if contiguous); equal
        to `snapshot().num_free_blocks`, without building a snapshot. Pure."""
        ...

    @abstractmethod
    def snapshot(self, refused_extent_slots: int = 0) -> Snapshot:
        """The six-way accounting (docs/memory.md) now. `refused_extent_slots` > 0 means the head-of-queue request was
        refused this step needing that contiguous extent (external fragmentation is then counted)."""
        ...

    @abstractmethod
    def can_swap_out(self, seq_ids: list[int]) -> bool:
        """Whether `swap_out(seq_ids)` would succeed now (False when there is no host space)."""
        ...

    @abstractmethod
    def swap_out(self, seq_ids: list[int]) -> SwapResult:
        """Mutates. Move a group's blocks to the host pool (capacity-limited); raises if it cannot.
        Swapped sequences keep their ids and token counts but hold no device slots."""
        ...

    @abstractmethod
    def can_swap_in(self, seq_ids: list[int]) -> bool:
        """Whether `swap_in(seq_ids)` would succeed now."""
        ...

    @abstractmethod
    def swap_in(self, seq_ids: list[int]) -> SwapResult:
        """Mutates. Bring a swapped-out group back to device blocks."""
        ...

    @abstractmethod
    def check_integrity(self) -> None:
        """Raise AssertionError naming the first broken invariant; a pure check."""
        ...

    # ---- optional capabilities, neutral by default ----------------------------------------------
    # pages mapped on demand behind virtual memory (`virtual-contiguous`)
    page_tokens: int = 0  # slots of one physical page mapped on demand; 0: the strategy maps nothing
    map_s_per_page: float = 0.0  # modeled seconds to map one page
    overlap_map: bool = False  # mapping overlaps the step's compute
    # a prefix cache's host tier (`allocators.prefix.host_tier`)
    host_tier_blocks: int = 0  # blocks of host memory holding demoted prefix blocks; 0: no host tier
    overlap_load: bool = False  # host-tier (and shared-tier) loads overlap the step's compute
    # a recurrent model's state (docs/recurrent.md): blocks each sequence's state takes beside its KV
    state_blocks_per_seq: int = 0
    # the fleet's shared tier (`allocators.prefix.shared_tier`), one object for every replica
    shared_tier = None  # the SharedTier this strategy demotes to and promotes from; None: no shared tier
    shared_link_gb_s: float = 0.0  # GB/s of the link a shared-tier promote crosses (the clock's)

    @property
    def shared_tier_blocks(self) -> int:
        """Blocks of the shared tier (0: none)."""
        return 0 if self.shared_tier is None else self.shared_tier.num_blocks

    @property
    def virtual_slots(self) -> int:
        """Slots of the KV pool the kernel addresses (more than `capacity_slots` when pages are mapped
        on demand behind a larger virtual range)."""
        return self.capacity_slots

    @property
    def layer_groups(self) -> tuple[LayerGroup, ...]:
        """The pool's layer groups, each with a block table of its own (docs/hybrid.md)."""
        return ONE_GROUP

    def group_slot_mapping(self, group: int, seq_id: int, start: int, stop: int) -> np.ndarray:
        """Slots of token positions [start, stop) of the sequence in layer group `group`'s table."""
        return self.slot_mapping(seq_id, start, stop)

    def describe_group(self, group: int, seq_ids: list[int]) -> PagedDescriptor | ContiguousDescriptor:
        """The kernel's view of these sequences in layer group `group`'s table."""
        return self.describe(seq_ids)

    def end_step(self) -> StepEffects:
        """Mutates (each effect is reported once). The step's allocations are done: what it did beyond
        them since the last call."""
        return NO_EFFECTS

    def cached_prompt_tokens(self, token_ids: np.ndarray) -> int:
        """Pure. Leading tokens of a prompt (int32 [T]) that an admission now would take from this pool's
        prefix cache (device or host tier) instead of computing: what a router reading the real cache
        sees. 0 without a prefix cache."""
        return 0

    def prefix_match(self, token_ids: np.ndarray) -> PrefixMatch:
        """Pure (no use recorded, no hit counted). The prompt's (int32 [T]) match in this strategy's own prefix
        index, what a cache-aware admission order reads (workbench.engine.admission_order). `NO_MATCH`
        without a prefix index."""
        return NO_MATCH

    def counters(self) -> dict[str, int]:
        """Whole-run counters for the summary (docs/outputs.md)."""
        return {"prefix_query_tokens": self.prefix_query_tokens, "prefix_hit_tokens": self.prefix_hit_tokens,
                "prefix_evicted_blocks": self.prefix_evicted_blocks}
