"""`paged`: PagedAttention's block manager (docs/strategies.md) with batch-level bookkeeping.

Blocks are allocated on demand and freed on completion. A group admitted together (parallel
sampling) and a fork share blocks by reference count; the first write into a shared block copies it
(copy-on-write), except for its last holder, which writes in place. Swap moves a group's distinct
blocks to a host pool of `swap_slots // block_size` blocks and back (`paged.swap`).

Prefix caching (`prefix.prefix_cache`) fills in the hooks this class leaves neutral: the lookup at
admission, the registration of filled blocks, where a released block goes and where a taken one
comes from.

State lives in numpy arrays (refcounts, a free-block stack, per-sequence columns and a 2-D block
table); a decode step is two compiled passes over the batch (`paged.loops`), so its cost grows with
the batch, never with the pool.

State invariants (checked by `check_integrity`):
- A sequence's block table holds ceil(length / block_size) distinct blocks; all but the last are
  full. Tables are append-only except for a copy-on-write, which replaces the last entry.
- `_refcount[b]` = number of on-device sequences whose table holds b. Every block is exactly one of:
  held (refcount > 0), free (in the stack), or cached (evictable in the prefix index, if any).
- Every holder of a block sees the same number of written slots in it (its "fill"): a writer into a
  shared block copies first, so the shared copy never changes under the other holders.

Accounting rule for an unwritten slot of a held block (the only partial blocks are last blocks):
it is *reserved* if some holder will write that position (its final length reaches it), else
*internal fragmentation*. Only one holder of a shared block ever writes it in place (the others copy
first); the count credits the holder that reaches furthest, so a shared block's slots are never
counted twice and a block that no holder will fill is internal fragmentation.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from workbench.allocators.base import Strategy
from workbench.allocators.paged import pool_counts
from workbench.allocators.paged.block_stack import BlockStack
from workbench.allocators.paged.compiled_pool import CompiledPool
from workbench.allocators.paged.integrity import check_paged
from workbench.allocators.paged.swap import PagedSwap
from workbench.allocators.paged.tables import BlockTables
from workbench.allocators.prefix.index import PrefixIndex
from workbench.allocators.prefix.tier_walk import NO_TIER_HITS, TierHits, TierWalk
from workbench.allocators.state.book import StateBook, StateSpec
from workbench.allocators.values import AdmitResult, AppendResult, PagedDescriptor, SeqSpec, Snapshot, blocks_refused
from workbench.intmath import cdiv

NO_BLOCKS = np.zeros(0, dtype=np.int32)
_NO_KEYS = np.zeros(0, dtype=np.uint64)
_BLOCK_TABLE_ENTRY_BYTES = 4  # one int32 block id per table entry, as in kv_indices


class Counted(NamedTuple):
    """An admission as `PagedStrategy._count_admission` counted it."""

    hits: np.ndarray  # int32 [num_hit]: device blocks holding the prompt's leading full blocks
    keys: np.ndarray  # uint64 [num_full_blocks]: the prompt's block keys
    below: TierHits  # blocks the tiers below hold after the hits, copied into the first fresh blocks
    num_tokens: int  # tokens the sequences hold after the admission
    num_blocks: int  # blocks each sequence's table holds
    revived: int  # hits sitting in the cache (refcount 0)
    need: int  # fresh blocks taken


class PagedStrategy(PagedSwap, Strategy):
    name = "paged"
    kernel_mode = "paged"
    grows_by_blocks = True
    supports_swap = True
    prefix: PrefixIndex | None = None  # a prefix cache's index (`prefix.prefix_cache`)
    _tiers: TierWalk | None = None  # a prefix cache's tiers below the device

    def __init__(self, *, capacity_slots: int, block_size: int, max_model_len: int, swap_slots: int = 0,
                 state: StateSpec | None = None) -> None:
        """`state`: the model's recurrent state (docs/recurrent.md), held beside the KV blocks in the same pool."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if capacity_slots < block_size:
            raise ValueError(f"capacity_slots ({capacity_slots}) holds no block of {block_size} slots")
        if swap_slots < 0:
            raise ValueError(f"swap_slots must be >= 0, got {swap_slots}")
        self.block_size = block_size
        self.num_blocks = capacity_slots // block_size
        self.capacity_slots = self.num_blocks * block_size
        self.max_model_len = max_model_len
        self.swapped_out_blocks = 0  # blocks moved device→host so far
        self.swapped_in_blocks = 0
        self._refcount = np.zeros(self.num_blocks, dtype=np.int32)  # [num_blocks]
        self._free = BlockStack(self.num_blocks)
        self._host_refcount = np.zeros(swap_slots // block_size, dtype=np.int32)  # [num_host_blocks]
        self._host_free = BlockStack(swap_slots // block_size)
        self.tables = BlockTables(block_size, self.num_blocks)
        self.counts = pool_counts.new_counts()  # written slots, logical slots, table entries (`pool_counts`)
        self.needs_prompt_ids = False
        self.state = None if state is None else StateBook(state, block_size)
        if self.state is not None:  # a state is overwritten in place: no swap copy or draft rollback is built for it
            self.state_blocks_per_seq = state.blocks_per_state
            self.supports_swap = False
            self.supports_drafts = False

    # -- hooks a prefix cache fills in (`prefix.prefix_cache`) -------------------------------------

    def _lookup(self, spec: SeqSpec) -> tuple[np.ndarray, np.ndarray, TierHits]:
        """Pure. Blocks already holding a leading run of the prompt's full blocks (int32 [num_hit]), the
        prompt's block keys (uint64 [num_full_blocks]) and the blocks the tiers below hold after those."""
        del spec  # no cache: nothing is held already
        return NO_BLOCKS, _NO_KEYS, NO_TIER_HITS

    def _on_admitted(self, seq_ids: list[int], spec: SeqSpec, keys: np.ndarray, blocks: np.ndarray,
                     num_hit: int, num_held: int, below: TierHits) -> None:
        """Mutates a cache's index after a successful admission of the `num_held` tokens now held."""

    def _on_extended(self, rows: np.ndarray, length: int, token_ids: np.ndarray, table: np.ndarray) -> None:
        """Mutates a cache's index after a group at `length` tokens grew by `token_ids` into `table`."""

    def _register_filled(self, rows: np.ndarray, token_ids: np.ndarray | None) -> None:
        """Mutates a cache's index after a decode append that may have filled the rows' last blocks."""

    def _on_forked(self, parent_row: int, child_row: int) -> None:
        """Mutates a cache's chains after a fork."""

    def _register_accepted(self, rows: np.ndarray, first: np.ndarray, accepted: np.ndarray,
                           token_ids: np.ndarray | None) -> None:
        """Mutates a cache's index after a verify step: row i's draft slots from position first[i] on hold
        `accepted[i]` verified tokens (`token_ids`, row after row)."""

    def _num_cached_blocks(self) -> int:
        """Blocks held only as cache: evictable, so allocatable."""
        return 0

    def registered_block_ids(self) -> np.ndarray:
        """Blocks registered in the prefix index (held or cached), int32 [num_registered]. Pure."""
        return NO_BLOCKS

    def _branch_point(self, keys: np.ndarray, spec: SeqSpec) -> int:
        """Pure. Where the prompt leaves the prefix the KV cache holds, in tokens (0 without a prefix cache)."""
        del keys, spec
        return 0

    def _take(self, k: int) -> np.ndarray:
        """Mutates. k blocks for new content, int32 [k]; the caller sets their refcounts."""
        return self._free.pop(k)

    def _release(self, blocks: np.ndarray) -> None:
        """Mutates. Blocks whose refcount reached 0, in table order (a sequence's head first)."""
        self._free.push(blocks)

    # -- protocol ---------------------------------------------------------------------------------

    def compiled_pool(self) -> CompiledPool | None:
        """For this class itself, without prefix cache or tiers and holding no sequence (the compiled loop's
        plain case); a subclass or a cache takes the general loop."""
        plain = type(self) is PagedStrategy and not len(self.tables.seqs) and self.state is None
        return CompiledPool(self) if plain else None

    def counters(self) -> dict[str, int]:
        """The protocol's counters, and with a recurrent state its checkpoints' (docs/recurrent.md)."""
        counters = super().counters()
        return counters if self.state is None else {**counters, **self.state.counters()}

    def num_allocatable_blocks(self) -> int:
        """Blocks a request can get now: free ones plus evictable cached ones (and evictable state checkpoints)."""
        checkpoints = 0 if self.state is None else self.state.evictable()
        return self._free.size + self._num_cached_blocks() + checkpoints

    def admit(self, seq_ids: list[int], spec: SeqSpec) -> AdmitResult:
        """Mutates on success. The group's sequences share every block of the prompt (of the tokens
        they hold: the hit and the first chunk, with `spec.num_new_tokens`)."""
        self._check_new(seq_ids, spec)
        counted = self._count_admission(len(seq_ids), spec)
        if isinstance(counted, str):
            return AdmitResult(False, reason=counted)
        return self._place_admission(seq_ids, spec, counted)

    def _count_admission(self, n: int, spec: SeqSpec) -> Counted | str:
        """Pure. What admitting a group of `n` sequences holding `spec` takes, or why the pool refuses it."""
        bs = self.block_size
        hits, keys, below = self._lookup(spec)  # `below`: copied into the first fresh blocks
        num_hit = hits.shape[0]
        num_tokens = spec.num_held((num_hit + below.num_host + below.num_shared) * bs)
        num_blocks = cdiv(num_tokens, bs)
        revived = int(np.count_nonzero(self._refcount[hits] == 0)) if num_hit else 0  # hits sitting in the cache
        need, allocatable = pool_counts.admission_blocks(num_blocks, num_hit, self.num_allocatable_blocks(), revived)
        state_need = n * self.state_blocks_per_seq  # each sequence's recurrent state (0 without one)
        if self.state is not None and num_hit:  # the hit's checkpoint is copied from, not evicted
            allocatable -= self.state_blocks_per_seq
        if need + state_need > allocatable:
            return blocks_refused(need + state_need, allocatable)
        return Counted(hits, keys, below, num_tokens, num_blocks, revived, need)

    def _place_admission(self, seq_ids: list[int], spec: SeqSpec, counted: Counted) -> AdmitResult:
        """Mutates. The admission `_count_admission` counted, which the pool can supply."""
        bs = self.block_size
        hits, keys, below, num_tokens, num_blocks, revived, need = counted
        num_hit, n = hits.shape[0], len(seq_ids)
        if self.state is not None:
            branch = self._branch_point(keys, spec)
            if num_hit:
                self.state.use(int(keys[num_hit - 1]))
        claimed = self._tiers.claim(keys, num_hit, below) if self._tiers is not None else None
        fresh = self._take_after_claiming(hits, n, need)
        if claimed is not None:
            self._tiers.promote(claimed, fresh)
        self._refcount[fresh] = n
        blocks = np.concatenate([hits, fresh]) if num_hit else fresh
        for seq_id in seq_ids:
            self.tables.add(seq_id, blocks, num_tokens, spec.final_len)
        # hits still on the device were written before; promoted blocks arrive written by their copy
        pool_counts.added(self.counts, num_tokens, n, num_blocks, (num_hit - revived) * bs)
        if self.state is not None:
            rows = self.tables.seqs.rows(seq_ids).tolist()
            self.state.attach(rows, self._take(n * self.state_blocks_per_seq), spec.num_tokens, branch)
        self._on_admitted(seq_ids, spec, keys, blocks, num_hit, num_tokens, below)
        if self.state is not None:
            self.state.land()
        return AdmitResult(True, cached_tokens=(num_hit + below.num_host + below.num_shared) * bs)

    def extend(self, seq_ids: list[int], token_ids: np.ndarray) -> AdmitResult:
        """Mutates on success. The group's shared table grows: its partial last block, held by the
        group alone, fills in place (every holder writes the same tokens) and new blocks are shared
        like the prompt's."""
        t, bs = self.tables, self.block_size
        rows = t.seqs.rows(seq_ids)
        self._check_on_device(rows)
        blocks = t.blocks_of(int(rows[0]))
        length, k, n = int(t.seqs.column("length")[rows[0]]), token_ids.shape[0], rows.shape[0]
        if any(not np.array_equal(t.blocks_of(int(r)), blocks) for r in rows[1:].tolist()) or \
                not np.all(t.seqs.column("length")[rows] == length) or \
                (length % bs and self._refcount[blocks[-1]] != n):
            raise ValueError(f"sequences {seq_ids} do not share one block table of their own: not one group "
                             f"being prefilled")
        if length + k > int(t.seqs.column("final_len")[rows].min()):
            raise ValueError(f"extending {seq_ids} by {k} tokens passes their final length")
        need = cdiv(length + k, bs) - blocks.shape[0]
        if need > self.num_allocatable_blocks():
            return AdmitResult(False, reason=blocks_refused(need, self.num_allocatable_blocks()))
        fresh = self._take(need)
        self._refcount[fresh] = n
        for row in rows.tolist():
            t.extend_row(row, fresh, length + k)
        pool_counts.added(self.counts, k, n, need, 0)
        self._on_extended(rows, length, token_ids, np.concatenate([blocks, fresh]))
        return AdmitResult(True)

    def _take_after_claiming(self, hits: np.ndarray, n: int, need: int) -> np.ndarray:
        """Mutates. Hits gain n holders first, so that taking `need` fresh blocks cannot evict them."""
        if hits.shape[0]:
            self.prefix.claim(hits)
            self._refcount[hits] += n
        return self._take(need)

    def fork(self, parent_id: int, child_id: int) -> AdmitResult:
        """Mutates. The child shares all of the parent's blocks (and continues its key chain); never
        needs a new block."""
        if self.state is not None:
            raise ValueError(f"cannot fork sequence {parent_id}: a fork of a recurrent state is not built")
        parent = self.tables.seqs.row(parent_id)
        if self.tables.swapped[parent]:
            raise ValueError(f"cannot fork sequence {parent_id}: it is swapped out")
        blocks = self.tables.blocks_of(parent)
        length = int(self.tables.seqs.column("length")[parent])
        self.tables.add(child_id, blocks, length, int(self.tables.seqs.column("final_len")[parent]))
        self._refcount[blocks] += 1
        pool_counts.added(self.counts, length, 1, blocks.shape[0], length)
        self._on_forked(parent, self.tables.seqs.row(child_id))
        return AdmitResult(True)

    def free(self, seq_id: int) -> None:
        """Mutates. Blocks no other sequence holds go back to the pool (or the prefix cache)."""
        t = self.tables
        row = t.seqs.row(seq_id)
        if t.swapped[row]:
            blocks = t.blocks_of(row)
            self._host_refcount[blocks] -= 1
            self._host_free.push(blocks[self._host_refcount[blocks] == 0])
        else:
            released, written = t.release_row(row, self._refcount)
            pool_counts.released(self.counts, written, t.seqs.column("length")[row], t.seqs.column("num_blocks")[row])
            self._release(released)
            if self.state is not None:
                self._free.push(self.state.detach(row))
        t.remove(seq_id)

    def can_append(self, seq_ids: list[int]) -> bool:
        rows = self.tables.seqs.rows(seq_ids)
        return self.tables.count_append(seq_ids, rows, self._refcount) <= self.num_allocatable_blocks()

    def append(self, seq_ids: list[int], token_ids: np.ndarray | None = None) -> AppendResult:
        """Mutates. One new slot per sequence, in batch order: a sequence whose last block is full gets
        a new block; a writer into a shared block gets a private copy (returned as a (src, dst) pair)
        unless it is the block's last holder, which writes in place. Raises RuntimeError, changing
        nothing, when the pool cannot supply the blocks. With a prefix index, each sequence whose block
        became full with this token registers it under its chain key (`token_ids` None: the batch's
        sequences register nothing more); without one `token_ids` is ignored."""
        rows = self.tables.seqs.rows(seq_ids)
        num_new = self.tables.count_append(seq_ids, rows, self._refcount)
        if num_new > self.num_allocatable_blocks():
            raise RuntimeError(f"out of blocks: append needs {num_new}, {self.num_allocatable_blocks()} allocatable")
        return self._append_counted(rows, num_new, token_ids)

    def append_if_room(self, seq_ids: list[int], token_ids: np.ndarray | None = None) -> AppendResult | None:
        """`append` when the pool can supply it, else None (nothing changed); the batch is counted once, and
        without a prefix cache (blocks come from the free stack alone) counted, taken and written in one
        compiled call."""
        if type(self).append is not PagedStrategy.append:  # a subclass's own append is the one to run
            return super().append_if_room(seq_ids, token_ids)
        rows = self.tables.seqs.rows(seq_ids)
        if self.prefix is None:
            appended = self.tables.append_from(seq_ids, rows, self._refcount, self._free)
            if appended is None:
                return None
            slots, copies, copied_slots, grown = appended
            pool_counts.appended(self.counts, rows.shape[0], copied_slots, grown)
            return AppendResult(slots=slots, copies=copies)
        num_new = self.tables.count_append(seq_ids, rows, self._refcount)
        if num_new > self.num_allocatable_blocks():
            return None
        return self._append_counted(rows, num_new, token_ids)

    def _append_counted(self, rows: np.ndarray, num_new: int, token_ids: np.ndarray | None,
                        register: bool = True) -> AppendResult:
        """Mutates. `append` of the batch in `rows`, which takes `num_new` blocks (counted, and allocatable);
        `register` False: the slots hold unverified drafts, which no prefix index may see."""
        t = self.tables
        slots, copies, copied_slots, grown = t.apply_append(rows, self._refcount, self._take(num_new))
        pool_counts.appended(self.counts, rows.shape[0], copied_slots, grown)
        if register:
            self._register_filled(rows, token_ids)
        return AppendResult(slots=slots, copies=copies)

    supports_drafts = True

    def append_with_drafts(self, seq_ids: list[int], token_ids: np.ndarray | None,
                           num_drafts: np.ndarray) -> AppendResult | None:
        """`Strategy.append_with_drafts`, counted before anything changes: the last tokens' append (copies
        included) plus each sequence's blocks for its drafts, whose rounds then cannot fail. After the first
        round every last block is private, so the drafts take new blocks only."""
        t, bs = self.tables, self.block_size
        rows = t.seqs.rows(seq_ids)
        first = t.count_append(seq_ids, rows, self._refcount)
        length = t.seqs.column("length")[rows] + 1
        if np.any(length + num_drafts > t.seqs.column("final_len")[rows]):
            raise ValueError(f"drafts of {seq_ids} pass their final length")
        drafts_blocks = int((cdiv(length + num_drafts, bs) - cdiv(length, bs)).sum())
        if first + drafts_blocks > self.num_allocatable_blocks():
            return None
        appended = self._append_counted(rows, first, token_ids)
        copies = [appended.copies]
        for j in range(1, int(num_drafts.max(initial=0)) + 1):
            drafting = rows[num_drafts >= j]
            more = t.count_append(seq_ids, drafting, self._refcount)
            copies.append(self._append_counted(drafting, more, None, register=False).copies)
        return AppendResult(slots=appended.slots, copies=np.concatenate(copies) if len(copies) > 1 else copies[0])

    def settle_drafts(self, seq_ids: list[int], num_drafts: np.ndarray, accepted: np.ndarray,
                      token_ids: np.ndarray | None) -> None:
        rows = self.tables.seqs.rows(seq_ids)
        first = self.tables.seqs.column("length")[rows] - num_drafts
        self._register_accepted(rows, first, accepted, token_ids)
        self._drop_tail(seq_ids, num_drafts - accepted)

    def _drop_tail(self, seq_ids: list[int], num_slots: np.ndarray) -> None:
        """Mutates. The rows shrink and the blocks past their new length (private: drafts never share a block)
        return to the pool."""
        t = self.tables
        shrinking = num_slots > 0
        rows, k = t.seqs.rows(seq_ids)[shrinking], num_slots[shrinking]
        dropped = t.truncate_rows(rows, t.seqs.column("length")[rows] - k)
        self._refcount[dropped] -= 1  # distinct blocks: a draft's block is its sequence's alone
        pool_counts.released(self.counts, k.sum(), k.sum(), dropped.shape[0])
        self._release(dropped[self._refcount[dropped] == 0])

    def slot_mapping(self, seq_id: int, start: int, stop: int) -> np.ndarray:
        return self.tables.slot_mapping(seq_id, start, stop)

    def describe(self, seq_ids: list[int]) -> PagedDescriptor:
        return self.tables.describe(self.tables.seqs.rows(seq_ids))

    def snapshot(self, refused_extent_slots: int = 0) -> Snapshot:
        """Pure. O(on-device sequences), vectorized; external fragmentation is always 0."""
        del refused_extent_slots  # every free block fits any request: no external fragmentation
        bs = self.block_size
        reserved = self.tables.reserved_slots(self._refcount)
        cached = self._num_cached_blocks() * bs
        free = self._free.size * bs
        held_slots = self.capacity_slots - cached - free
        state = checkpoints = 0
        if self.state is not None:  # the blocks the states hold, in slots
            state = len(self.state.live) * self.state.spec.blocks_per_state * bs
            checkpoints = self.state.held_blocks() * bs
        written, logical, entries = self.counts.tolist()
        return Snapshot(
            capacity_slots=self.capacity_slots, token_slots=written, reserved_slots=reserved,
            internal_frag_slots=pool_counts.internal_frag_slots(held_slots, written, reserved, state + checkpoints),
            cached_slots=cached, external_frag_slots=0, free_slots=free, logical_token_slots=logical,
            block_table_bytes=_BLOCK_TABLE_ENTRY_BYTES * entries,
            largest_free_extent_slots=free,  # any set of free blocks serves a request: one extent
            num_free_blocks=self.num_allocatable_blocks(), state_slots=state, state_checkpoint_slots=checkpoints)

    # -- internals --------------------------------------------------------------------------------

    def _check_new(self, seq_ids: list[int], spec: SeqSpec) -> None:
        if not seq_ids:
            raise ValueError("admit needs at least one sequence id")
        if spec.num_tokens < 1:
            raise ValueError("a sequence is admitted with at least one token")
        if not spec.num_tokens <= spec.final_len <= self.max_model_len:
            raise ValueError(f"need 1 <= num_tokens ({spec.num_tokens}) <= final_len ({spec.final_len}) "
                             f"<= max_model_len ({self.max_model_len})")
        if len(set(seq_ids)) != len(seq_ids) or not self.tables.seqs.none_live(seq_ids):
            raise ValueError(f"sequence ids {seq_ids} repeat or are already live")

    def check_integrity(self) -> None:
        check_paged(self.tables, max_model_len=self.max_model_len, refcount=self._refcount,
                    host_refcount=self._host_refcount, free_ids=self._free.ids(), host_free_ids=self._host_free.ids(),
                    cached_ids=NO_BLOCKS if self.prefix is None else self.prefix.evictable_block_set(),
                    registered_ids=self.registered_block_ids(),
                    written_slots=int(self.counts[pool_counts.WRITTEN]),
                    logical_slots=int(self.counts[pool_counts.LOGICAL]),
                    table_entries=int(self.counts[pool_counts.ENTRIES]),
                    state_ids=NO_BLOCKS if self.state is None else self.state.block_ids())
        if self.state is not None:
            self.state.check()
            on_device = self.tables.on_device_rows()
            if sorted(self.state.live) != sorted(on_device.tolist()):
                raise AssertionError("live recurrent states are not exactly the on-device sequences'")
