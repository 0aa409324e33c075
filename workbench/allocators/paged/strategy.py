"""`paged`: PagedAttention's block manager (docs/strategies.md) with batch-level bookkeeping.

Blocks are allocated on demand and freed on completion. A group admitted together (parallel
sampling) and a fork share blocks by reference count; the first write into a shared block copies it
(copy-on-write), except for its last holder, which writes in place. Swap moves a group's distinct
blocks to a host pool of `swap_slots // block_size` blocks and back (`paged.swap`).

Prefix caching is composed, not subclassed: given a `PrefixIndex` (`prefix.index`), the strategy
looks a prompt's chain keys up in it at admission, registers the full blocks it fills (prompt and
decode, keys from `prefix.chains`), hands blocks that reach refcount 0 to it (registered ones stay
cached, evictable) and evicts through it when the free stack is empty. Without one it is `paged`.
With a `HostTier` (`host_tier`) too, evicted blocks are demoted to host memory and a prompt's chain
continues past its device hits into the host tier, whose blocks are promoted (`allocators.prefix.host_tier`).
With a fleet's `SharedTier` (`shared_tier`) below that, what the host tier drops (or, without one, what
the device evicts) is demoted into the shared pool, and the chain continues past the host-tier hits into
it; a shared hit is copied, not moved (`allocators.prefix.shared_tier`, `.shared_port`).

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

import numpy as np

from workbench.allocators.base import (
    NO_EFFECTS,
    NO_MATCH,
    NO_PAIRS,
    AdmitResult,
    AppendResult,
    PagedDescriptor,
    PrefixMatch,
    SeqSpec,
    Snapshot,
    StepEffects,
    Strategy,
    blocks_refused,
)
from workbench.allocators.paged.block_stack import BlockStack
from workbench.allocators.paged.compiled_pool import CompiledPool
from workbench.allocators.paged.integrity import check_paged
from workbench.allocators.paged.swap import PagedSwap
from workbench.allocators.paged.tables import BlockTables
from workbench.allocators.prefix.chains import SeqChains
from workbench.allocators.prefix.host_tier import HostTier
from workbench.allocators.prefix.index import PrefixIndex
from workbench.allocators.prefix.shared_port import SharedTierPort
from workbench.allocators.prefix.shared_tier import SharedTier
from workbench.intmath import cdiv

_NO_BLOCKS = np.zeros(0, dtype=np.int32)
_NO_KEYS = np.zeros(0, dtype=np.uint64)
_BLOCK_TABLE_ENTRY_BYTES = 4  # one int32 block id per table entry, as in kv_indices


class PagedStrategy(PagedSwap, Strategy):
    name = "paged"
    kernel_mode = "paged"
    grows_by_blocks = True
    supports_swap = True

    def __init__(self, *, capacity_slots: int, block_size: int, max_model_len: int, swap_slots: int = 0,
                 prefix_index: PrefixIndex | None = None, host_tier: HostTier | None = None,
                 shared_tier: SharedTier | None = None) -> None:
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
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0  # device hits
        self.prefix_hit_tokens_host = 0  # host-tier hits (promoted)
        self.prefix_hit_tokens_shared = 0  # shared-tier hits (copied in)
        self.prefix_evicted_blocks = 0
        self.swapped_out_blocks = 0  # blocks moved device→host so far
        self.swapped_in_blocks = 0
        self._refcount = np.zeros(self.num_blocks, dtype=np.int32)  # [num_blocks]
        self._free = BlockStack(self.num_blocks)
        self._host_refcount = np.zeros(swap_slots // block_size, dtype=np.int32)  # [num_host_blocks]
        self._host_free = BlockStack(swap_slots // block_size)
        self.tables = BlockTables(block_size, self.num_blocks)
        self._written_slots = 0  # distinct written slots of held blocks = token_slots
        self._logical_slots = 0  # sum of lengths of on-device sequences
        self._table_entries = 0  # sum of table lengths of on-device sequences
        # reserved slots as the last decode append left them (`append_if_room`), -1 once anything else has
        # changed the tables since: the step's snapshot then reads it instead of counting again
        self._reserved_memo = -1
        self.prefix = prefix_index  # None: no prefix caching
        self.wants_token_ids = prefix_index is not None
        self.needs_prompt_ids = prefix_index is not None
        self._chains = SeqChains(block_size) if prefix_index is not None else None
        self.host_tier = host_tier  # None: evicted prefix blocks are dropped (or go to the shared tier)
        if shared_tier is not None and prefix_index is None:
            raise ValueError("a shared tier holds prefix blocks: it needs a prefix cache")
        self.shared_tier = shared_tier  # the fleet's pool, one object for every replica; None: no shared tier
        self._shared = SharedTierPort(shared_tier) if shared_tier is not None else None  # this replica's moves

    # -- optional capabilities (allocators.base) ------------------------------------------------

    @property
    def host_tier_blocks(self) -> int:
        return 0 if self.host_tier is None else self.host_tier.num_blocks

    def end_step(self) -> StepEffects:
        """Mutates: the tiers' step ends: the host tier's demotes and promotes and its two step columns
        (cached token slots and free ones, which sum to the tier's capacity), and this replica's moves in
        and out of the shared tier with the shared pool's two columns (the whole fleet's pool, as it
        stands after this step)."""
        host, shared = self.host_tier, self._shared
        if host is None and shared is None:
            return NO_EFFECTS
        bs = self.block_size
        demote = promote = spill = shared_demote = shared_promote = NO_PAIRS
        columns: tuple[tuple[str, int], ...] = ()
        if host is not None:
            demote, promote = host.take_moves()
            used = host.num_used()
            columns += (("host_token_slots", used * bs), ("host_free_slots", (host.num_blocks - used) * bs))
        if shared is not None:
            spill, shared_demote, shared_promote = shared.take_moves()
            used = shared.tier.num_used()
            columns += (("shared_token_slots", used * bs),
                        ("shared_free_slots", (shared.tier.num_blocks - used) * bs))
        return StepEffects(demote=demote, promote=promote, shared_spill=spill, shared_demote=shared_demote,
                           shared_promote=shared_promote, columns=columns)

    def counters(self) -> dict[str, int]:
        """The prefix counters, and with a host or shared tier its hits and the blocks moved each way."""
        counters = super().counters()
        if self.host_tier is not None:
            counters.update(prefix_hit_tokens_host=self.prefix_hit_tokens_host,
                            host_blocks_loaded=self.host_tier.promoted_blocks,
                            host_blocks_demoted=self.host_tier.demoted_blocks)
        if self._shared is not None:
            counters.update(prefix_hit_tokens_shared=self.prefix_hit_tokens_shared,
                            shared_blocks_loaded=self._shared.loaded_blocks,
                            shared_blocks_demoted=self._shared.demoted_blocks)
        return counters

    # -- prefix caching (identity without an index) --------------------------------------------

    def _lookup(self, spec: SeqSpec) -> tuple[np.ndarray, np.ndarray]:
        """Blocks already holding a leading run of the prompt's full blocks, int32 [num_hit], and the
        prompt's block keys (uint64 [num_full_blocks]; empty without a cache). Pure."""
        if self.prefix is None:
            return _NO_BLOCKS, _NO_KEYS
        keys = self._chains.prompt_keys(spec.token_ids)
        return self.prefix.lookup(keys, self._max_hit(spec)), keys

    def _max_hit(self, spec: SeqSpec) -> int:
        """Full blocks of the prompt a hit may cover: the last prompt token is left to compute."""
        return (spec.num_tokens - 1) // self.block_size

    def cached_prompt_tokens(self, token_ids: np.ndarray) -> int:
        return self._cached_tokens(SeqSpec(token_ids, token_ids.shape[0]))[0]

    def prefix_match(self, token_ids: np.ndarray) -> PrefixMatch:
        if self.prefix is None:
            return NO_MATCH
        spec = SeqSpec(token_ids, token_ids.shape[0])
        tokens, keys = self._cached_tokens(spec)
        return PrefixMatch(tokens, self.prefix.tree_path(keys, self._max_hit(spec)))

    def _cached_tokens(self, spec: SeqSpec) -> tuple[int, np.ndarray]:
        """Pure. `cached_prompt_tokens` of the prompt, and its block keys (`_lookup`)."""
        hits, keys = self._lookup(spec)
        num_host = self._host_lookup(spec, keys, hits.shape[0])
        num_shared = self._shared_lookup(spec, keys, hits.shape[0] + num_host)
        return (hits.shape[0] + num_host + num_shared) * self.block_size, keys

    def _host_lookup(self, spec: SeqSpec, keys: np.ndarray, num_dev: int) -> int:
        """Pure. How many full blocks after the `num_dev` device hits the host tier holds (0 without one)."""
        if self.host_tier is None:
            return 0
        return self.host_tier.lookup(keys[num_dev:self._max_hit(spec)])

    def _shared_lookup(self, spec: SeqSpec, keys: np.ndarray, num_above: int) -> int:
        """Pure. How many full blocks after the `num_above` device and host-tier hits the shared tier holds
        (0 without one): the walk goes down the tiers and never back up."""
        if self._shared is None:
            return 0
        return self._shared.lookup(keys[num_above:self._max_hit(spec)])

    def _on_admitted(self, seq_ids: list[int], spec: SeqSpec, keys: np.ndarray, blocks: np.ndarray,
                     num_hit: int, num_held: int, num_host: int = 0, num_shared: int = 0) -> None:
        """Mutates the prefix index, the chains and counters after a successful admission; only the
        `num_held` tokens held (a chunked admission's first chunk) fill blocks now. The `num_host` then
        `num_shared` blocks after the `num_hit` device hits were promoted: they are registered like new ones."""
        if self.prefix is None:
            return
        keys = keys[:num_held // self.block_size]
        parents = np.zeros_like(keys)  # [num_full]: each block's predecessor's key, 0 before the first
        parents[1:] = keys[:-1]
        before = np.full(keys.shape[0], -1, dtype=np.int32)  # [num_full]: each block's predecessor, -1: none
        before[1:] = blocks[:keys.shape[0] - 1]
        # a hit's key is registered already; a recomputed copy of a registered key is the index's to keep or not
        self.prefix.insert(parents[num_hit:], keys[num_hit:], blocks[num_hit:keys.shape[0]], before[num_hit:])
        self._chains.start(self.tables.seqs.rows(seq_ids), spec.token_ids[:num_held], keys,
                           self.tables.seqs.capacity_rows)
        self.prefix_query_tokens += spec.num_tokens
        self.prefix_hit_tokens += num_hit * self.block_size
        self.prefix_hit_tokens_host += num_host * self.block_size
        self.prefix_hit_tokens_shared += num_shared * self.block_size

    def _num_cached_blocks(self) -> int:
        return 0 if self.prefix is None else self.prefix.num_evictable()

    def cached_block_ids(self) -> np.ndarray:
        """Blocks kept only as prefix cache, next to evict first, int32 [num_cached]. Pure."""
        return _NO_BLOCKS if self.prefix is None else self.prefix.evictable_block_ids()

    def registered_block_ids(self) -> np.ndarray:
        """Blocks registered in the prefix index (held or cached), int32 [num_registered]. Pure."""
        return _NO_BLOCKS if self.prefix is None else self.prefix.registered_block_ids()

    def _take(self, k: int) -> np.ndarray:
        """Mutates. k blocks for new content, int32 [k]; the caller sets their refcounts. Never-cached
        free blocks go first; cached ones are evicted only when none is left."""
        if self.prefix is None or k <= self._free.size:
            return self._free.pop(k)
        if k > self.num_allocatable_blocks():
            raise RuntimeError(f"out of blocks: need {k}, {self.num_allocatable_blocks()} allocatable")
        taken = self._free.pop(self._free.size)
        self.prefix_evicted_blocks += k - taken.shape[0]
        if self.host_tier is None and self._shared is None:
            return np.concatenate([taken, self.prefix.evict(k - taken.shape[0])])
        evicted, keys = self.prefix.evict_keyed(k - taken.shape[0])
        # copied out before the step's writes reuse them: into the host tier, whose drops go to the shared
        # tier, or straight into the shared tier
        if self.host_tier is None:
            self._shared.demote(keys, evicted)
        else:
            dropped = self.host_tier.demote(keys, evicted)
            if self._shared is not None:
                self._shared.take_dropped(dropped)
        return np.concatenate([taken, evicted])

    def _release(self, blocks: np.ndarray) -> None:
        """Mutates. Blocks whose refcount reached 0, in table order (a sequence's head first)."""
        self._free.push(blocks if self.prefix is None else self.prefix.release(blocks))

    # -- protocol ---------------------------------------------------------------------------------

    def compiled_pool(self) -> CompiledPool | None:
        """For this class itself, without prefix cache or tiers and holding no sequence (the compiled loop's
        plain case); a subclass or a cache takes the general loop."""
        plain = (type(self) is PagedStrategy and self.prefix is None and self.host_tier is None
                 and self.shared_tier is None and not len(self.tables.seqs))
        return CompiledPool(self) if plain else None

    def num_allocatable_blocks(self) -> int:
        """Blocks a request can get now: free ones plus evictable cached ones."""
        return self._free.size + self._num_cached_blocks()

    def admit(self, seq_ids: list[int], spec: SeqSpec) -> AdmitResult:
        """Mutates on success. The group's sequences share every block of the prompt (of the tokens
        they hold: the hit and the first chunk, with `spec.num_new_tokens`)."""
        self._reserved_memo = -1
        self._check_new(seq_ids, spec)
        bs = self.block_size
        hits, keys = self._lookup(spec)
        num_hit = hits.shape[0]
        num_host = self._host_lookup(spec, keys, num_hit)  # promoted into the first fresh blocks
        num_shared = self._shared_lookup(spec, keys, num_hit + num_host)  # copied into the next ones
        num_tokens = spec.num_held((num_hit + num_host + num_shared) * bs)
        num_blocks = cdiv(num_tokens, bs)
        revived = int(np.count_nonzero(self._refcount[hits] == 0)) if num_hit else 0  # hits sitting in the cache
        need = num_blocks - num_hit
        allocatable = self.num_allocatable_blocks() - revived
        if need > allocatable:
            return AdmitResult(False, reason=blocks_refused(need, allocatable))
        n = len(seq_ids)
        # out of the host tier (and kept in the shared one) before taking device blocks, whose evictions
        # demote into them
        host_blocks = self.host_tier.take(keys[num_hit:num_hit + num_host]) if num_host else None
        num_above = num_hit + num_host
        shared_blocks = self._shared.read(keys[num_above:num_above + num_shared]) if num_shared else None
        fresh = self._take_after_claiming(hits, n, need)
        if num_host:
            self.host_tier.promote(host_blocks, fresh[:num_host])
        if num_shared:
            self._shared.promote(shared_blocks, fresh[num_host:num_host + num_shared])
        self._refcount[fresh] = n
        blocks = np.concatenate([hits, fresh]) if num_hit else fresh
        for seq_id in seq_ids:
            self.tables.add(seq_id, blocks, num_tokens, spec.final_len)
        self._written_slots += num_tokens - num_hit * bs + revived * bs  # promoted blocks arrive written
        self._logical_slots += n * num_tokens
        self._table_entries += n * num_blocks
        self._on_admitted(seq_ids, spec, keys, blocks, num_hit, num_tokens, num_host, num_shared)
        return AdmitResult(True, cached_tokens=(num_hit + num_host + num_shared) * bs)

    def extend(self, seq_ids: list[int], token_ids: np.ndarray) -> AdmitResult:
        """Mutates on success. The group's shared table grows: its partial last block, held by the
        group alone, fills in place (every holder writes the same tokens) and new blocks are shared
        like the prompt's."""
        self._reserved_memo = -1
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
        self._written_slots += k
        self._logical_slots += n * k
        self._table_entries += n * need
        if self.prefix is not None:
            parents, keys = self._chains.extend(rows, length, token_ids)
            table = np.concatenate([blocks, fresh])  # [num_blocks] the group's shared table
            first = length // bs  # the first block this chunk can fill
            filled = table[first:first + keys.shape[0]]
            # each filled block's predecessor in the table (-1 for the first block)
            before = np.concatenate([[-1], table])[first:first + keys.shape[0]].astype(np.int32)
            self.prefix.insert(parents, keys, filled, before)
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
        self._reserved_memo = -1
        parent = self.tables.seqs.row(parent_id)
        if self.tables.swapped[parent]:
            raise ValueError(f"cannot fork sequence {parent_id}: it is swapped out")
        blocks = self.tables.blocks_of(parent)
        length = int(self.tables.seqs.column("length")[parent])
        self.tables.add(child_id, blocks, length, int(self.tables.seqs.column("final_len")[parent]))
        self._refcount[blocks] += 1
        self._logical_slots += length
        self._table_entries += blocks.shape[0]
        if self.prefix is not None:
            self._chains.fork(parent, self.tables.seqs.row(child_id), self.tables.seqs.capacity_rows)
        return AdmitResult(True)

    def free(self, seq_id: int) -> None:
        """Mutates. Blocks no other sequence holds go back to the pool (or the prefix cache)."""
        self._reserved_memo = -1
        t = self.tables
        row = t.seqs.row(seq_id)
        if t.swapped[row]:
            blocks = t.blocks_of(row)
            self._host_refcount[blocks] -= 1
            self._host_free.push(blocks[self._host_refcount[blocks] == 0])
        else:
            released, written = t.release_row(row, self._refcount)
            self._written_slots -= written
            self._logical_slots -= int(t.seqs.column("length")[row])
            self._table_entries -= int(t.seqs.column("num_blocks")[row])
            self._release(released)
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
            slots, copies, copied_slots, grown, self._reserved_memo = appended
            self._written_slots += rows.shape[0] + copied_slots  # copied slots now exist twice
            self._logical_slots += rows.shape[0]
            self._table_entries += grown
            return AppendResult(slots=slots, copies=copies)
        num_new = self.tables.count_append(seq_ids, rows, self._refcount)
        if num_new > self.num_allocatable_blocks():
            return None
        return self._append_counted(rows, num_new, token_ids)

    def _append_counted(self, rows: np.ndarray, num_new: int, token_ids: np.ndarray | None) -> AppendResult:
        """Mutates. `append` of the batch in `rows`, which takes `num_new` blocks (counted, and allocatable)."""
        self._reserved_memo = -1
        t = self.tables
        slots, copies, copied_slots, grown = t.apply_append(rows, self._refcount, self._take(num_new))
        self._written_slots += rows.shape[0] + copied_slots  # copied slots now exist twice
        self._logical_slots += rows.shape[0]
        self._table_entries += grown
        if self.prefix is not None:
            self._register_filled(rows, token_ids)
        return AppendResult(slots=slots, copies=copies)

    def _register_filled(self, rows: np.ndarray, token_ids: np.ndarray | None) -> None:
        """Mutates. The block just filled holds exactly its sequence's tokens: a writer into a shared
        block copies it first, so diverging samples each register their own block."""
        if token_ids is None:
            self._chains.forget(rows)
            return
        filled_rows, parents, keys = self._chains.advance(rows, self.tables.seqs.column("length"), token_ids)
        if filled_rows.shape[0]:
            self.prefix.insert(parents, keys, self.tables.last_blocks(filled_rows),
                               self.tables.previous_blocks(filled_rows))

    def slot_mapping(self, seq_id: int, start: int, stop: int) -> np.ndarray:
        return self.tables.slot_mapping(seq_id, start, stop)

    def describe(self, seq_ids: list[int]) -> PagedDescriptor:
        return self.tables.describe(self.tables.seqs.rows(seq_ids))

    def snapshot(self, refused_extent_slots: int = 0) -> Snapshot:
        """Pure. O(on-device sequences), vectorized; external fragmentation is always 0."""
        del refused_extent_slots  # every free block fits any request: no external fragmentation
        bs = self.block_size
        reserved = self._reserved_memo
        if reserved < 0:
            reserved = self.tables.reserved_slots(self._refcount)
        cached = self._num_cached_blocks() * bs
        free = self._free.size * bs
        held_slots = self.capacity_slots - cached - free
        return Snapshot(
            capacity_slots=self.capacity_slots, token_slots=self._written_slots, reserved_slots=reserved,
            internal_frag_slots=held_slots - self._written_slots - reserved, cached_slots=cached,
            external_frag_slots=0, free_slots=free, logical_token_slots=self._logical_slots,
            block_table_bytes=_BLOCK_TABLE_ENTRY_BYTES * self._table_entries,
            largest_free_extent_slots=free,  # any set of free blocks serves a request: one extent
            num_free_blocks=self.num_allocatable_blocks())

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
        free = self._free.ids()
        check_paged(self.tables, max_model_len=self.max_model_len, refcount=self._refcount,
                    host_refcount=self._host_refcount, free_ids=free, host_free_ids=self._host_free.ids(),
                    cached_ids=_NO_BLOCKS if self.prefix is None else self.prefix.evictable_block_set(),
                    registered_ids=self.registered_block_ids(),
                    written_slots=self._written_slots, logical_slots=self._logical_slots,
                    table_entries=self._table_entries)
        if self.prefix is not None:
            self.prefix.check_integrity(self._refcount, free)
        if self.host_tier is not None:
            self.host_tier.check_integrity()
        if self.shared_tier is not None:
            self.shared_tier.check_integrity()
