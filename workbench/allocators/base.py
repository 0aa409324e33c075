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
from typing import Literal

import numpy as np

from workbench.allocators.values import (
    NO_EFFECTS,
    NO_MATCH,
    ONE_GROUP,
    AdmitResult,
    AppendResult,
    ContiguousDescriptor,
    LayerGroup,
    PagedDescriptor,
    PrefixMatch,
    SeqSpec,
    Snapshot,
    StepEffects,
    SwapResult,
)

KernelMode = Literal["paged", "contiguous"]


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
    # pool blocks one block of a sequence takes: a pool of layer groups (docs/hybrid.md) holds it in every group,
    # `units` blocks in each
    pool_blocks_per_block: int = 1
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

    def append_recomputed(self, seq_ids: list[int], token_ids: np.ndarray | None = None) -> AppendResult:
        """Mutates. `append` of a token the step computes together with its group's prompt (a group readmitted
        after a recompute appends each sequence's own generated tokens so): as `append`, except that a pool of
        window groups releases nothing for it yet, since the step's kernel writes and reads the whole prompt."""
        return self.append(seq_ids, token_ids)

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
