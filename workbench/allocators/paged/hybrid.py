"""Paged allocation for hybrid models: one block table per layer group over one shared pool (docs/hybrid.md).

The pool is counted in slots of one *unit*: one token's KV for `unit_layers` layers (the gcd of the
groups' layer counts, `ModelPreset.unit_layers`), so every block has the same size in bytes, as vLLM
v1 gives every KV-cache group the same page size. A group of `units` units stores a logical block
of a sequence as `units` pool blocks (`paged.hybrid_tables`). A sliding-window group releases a block as
soon as the sequence's next query cannot read it (vLLM v1's `SlidingWindowManager.remove_skipped_blocks`,
run before new blocks are allocated), so a long sequence holds at most cdiv(W, block_size) + 1 of
its blocks at a decode step, while full-attention groups keep everything.

Sharing: a group admitted together (parallel sampling) and a fork share entries by reference count
within each group, with copy-on-write of a shared last block as in `paged`. Blocks are never
shared across groups: each group's KV is different memory. With a prefix index (`paged-prefix`),
`paged.hybrid_prefix` finds hits by vLLM v1's rule and entries whose holders left stay cached (window
releases included) until evicted. No swap here (a preempted sequence is recomputed).

Accounting: the §3 parts of each group, in pool slots, sum to the group's held slots; the groups'
held slots plus the cached and free ones are the capacity (`group_snapshots` and `snapshot`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from workbench.allocators.base import Strategy
from workbench.allocators.paged.block_stack import BlockStack
from workbench.allocators.paged.hybrid_counts import last_block_parts
from workbench.allocators.paged.hybrid_integrity import check_hybrid
from workbench.allocators.paged.hybrid_prefix import HybridPrefixCache
from workbench.allocators.paged.hybrid_tables import GroupTables, group_columns
from workbench.allocators.prefix.hash_index import HashPrefixIndex
from workbench.allocators.prefix.keys import block_keys
from workbench.allocators.seq_rows import SeqRows
from workbench.allocators.values import (
    AdmitResult,
    AppendResult,
    GroupSnapshot,
    LayerGroup,
    PagedDescriptor,
    SeqSpec,
    Snapshot,
    SwapResult,
)
from workbench.intmath import cdiv

_BLOCK_TABLE_ENTRY_BYTES = 4  # one int32 id per kernel-table entry (released entries stay as placeholders)
_NO_COPIES = np.zeros((0, 2), dtype=np.int32)
_NO_KEYS = np.zeros(0, dtype=np.uint64)
_NO_BLOCKS = np.zeros(0, dtype=np.int32)


class _Counted(NamedTuple):
    """A decode step's append as `HybridPaged._count_append` counted it, for the append that follows."""

    need: list[int]  # per group: blocks it takes (new blocks and private copies)
    freed: int  # blocks the windows release first (to the free stack or the cache)
    rows: np.ndarray  # int64 [num_seqs]: the sequences' rows
    lengths: np.ndarray  # int64 [num_seqs]: the sequences' lengths before the step
    passed: list[list[tuple[int, int]]]  # per group: `_passed` (empty for a full-attention group)
    shared: list[bool]  # per group: `_writes_shared` (the window releases only lower holder counts after it)


class HybridPaged(Strategy):
    kernel_mode = "paged"
    grows_by_blocks = True
    supports_swap = False

    def __init__(self, *, capacity_slots: int, block_size: int, max_model_len: int,
                 groups: tuple[tuple[int | None, int], ...], name: str = "paged", swap_slots: int = 0,
                 prefix_index: HashPrefixIndex | None = None) -> None:
        """`groups`: (window_tokens or None, units) per layer group. `swap_slots` is accepted and unused.
        `prefix.index`: None for no prefix caching."""
        del swap_slots  # no swap: the engine preempts by recompute
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if not groups or any(units < 1 for _, units in groups):
            raise ValueError(f"groups must be a non-empty list of (window, units >= 1), got {groups}")
        self.name = name
        self.block_size = block_size
        self.num_blocks = capacity_slots // block_size
        self.capacity_slots = self.num_blocks * block_size
        if self.num_blocks < sum(units for _, units in groups):
            raise ValueError(f"capacity_slots ({capacity_slots}) holds no block of every group")
        self.max_model_len = max_model_len
        # per sequence: its length, final length and each group's first held and last entries, in columns
        # (a decode step reads and writes them over the batch at once)
        self.seqs = SeqRows(("length", "final_len", *(c for gi in range(len(groups)) for c in group_columns(gi))))
        self.groups = [GroupTables(window, units, block_size, self.seqs, gi)
                       for gi, (window, units) in enumerate(groups)]
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        self.prefix_evicted_blocks = 0  # pool blocks (every unit of an evicted entry)
        self.prefix = None if prefix_index is None else HybridPrefixCache(prefix_index, block_size, self.groups,
                                                                          self.seqs)
        self.wants_token_ids = self.prefix is not None
        self._refcount = np.zeros(self.num_blocks, dtype=np.int32)  # [num_blocks]: holders, over all groups
        self._free = BlockStack(self.num_blocks)
        # [num_blocks]: the group each block was last taken for (a held or cached block's group)
        self._group_of_block = np.zeros(self.num_blocks, dtype=np.int64)
        self._held_blocks = [0] * len(groups)  # per group: blocks some sequence holds
        self._reach_of = np.full(self.num_blocks, -1, dtype=np.int64)  # scratch of `last_block_parts`
        total_units = self._units_per_block = sum(g.units for g in self.groups)
        self._uniform = len({g.units for g in self.groups}) == 1  # every entry has the same number of blocks
        self._layer_groups = tuple(LayerGroup(g.window_tokens or 0, g.units / total_units) for g in self.groups)

    @property
    def layer_groups(self) -> tuple[LayerGroup, ...]:
        """One per table, its layers' share by units (each unit is `unit_layers` layers)."""
        return self._layer_groups

    # -- protocol ---------------------------------------------------------------------------------

    def num_allocatable_blocks(self) -> int:
        """Free blocks plus evictable cached ones."""
        return self._free.size + (0 if self.prefix is None else self.prefix.cached_blocks)

    @property
    def pool_blocks_per_block(self) -> int:
        """Every group holds a sequence's block, in `units` pool blocks."""
        return self._units_per_block

    def admit(self, seq_ids: list[int], spec: SeqSpec) -> AdmitResult:
        """Mutates on success. Every group gets the prompt after the prefix hit (its extend kernel reads
        it) and, of the hit, the blocks the first computed query reads (all of them in a full group); a
        window group drops what it no longer needs at the sequence's first decode step."""
        self._check_new(seq_ids, spec)
        keys, num_hit, hits = self._lookup(spec)
        num_logical = cdiv(spec.num_tokens, self.block_size)
        revived = sum(e.shape[0] for entries in hits for e in entries if self._refcount[e[0]] == 0)
        need = (num_logical - num_hit) * sum(g.units for g in self.groups)
        allocatable = self.num_allocatable_blocks() - revived  # revived hits leave the cache
        if need > allocatable:
            return AdmitResult(False, reason=f"needs {need} blocks, {allocatable} allocatable")
        n = len(seq_ids)
        rows = np.array([self.seqs.add(seq_id) for seq_id in seq_ids], dtype=np.int64)
        self.seqs.columns["length"][rows] = spec.num_tokens
        self.seqs.columns["final_len"][rows] = spec.final_len
        if self.prefix is not None:  # claimed before any eviction, so taking fresh blocks cannot evict them
            for gi, entries in enumerate(hits):  # revived hits are held again
                self._held_blocks[gi] += sum(e.shape[0] for e in entries if self._refcount[e[0]] == 0)
            claimed = [e for entries in hits for e in entries]
            self.prefix.claim(claimed, self._refcount)
            for e in claimed:
                self._refcount[e] += n
        for gi, (g, hit) in enumerate(zip(self.groups, hits, strict=True)):
            fresh = self._take((num_logical - num_hit) * g.units, gi).reshape(num_logical - num_hit, g.units)
            self._refcount[fresh.ravel()] = n
            self._held_blocks[gi] += fresh.size
            skip = num_hit - len(hit)  # hit blocks before the first query's window: not held
            entries = [None] * skip + hit + list(fresh)  # int32 [units] each; shared by the group's sequences
            for seq_id in seq_ids:
                g.entries[seq_id] = list(entries)
            g.first_live[rows] = skip
            g.last[rows] = int(entries[-1][0])
        if self.prefix is not None:  # the hit's blocks are registered already
            self.prefix.register_prompt(seq_ids, spec.token_ids, keys, num_hit)
            self.prefix_query_tokens += spec.num_tokens
            self.prefix_hit_tokens += num_hit * self.block_size
        return AdmitResult(True, cached_tokens=num_hit * self.block_size)

    def _lookup(self, spec: SeqSpec) -> tuple[np.ndarray, int, list[list[np.ndarray]]]:
        """Pure. The prompt's chain keys (uint64 [num_full_blocks]), the hit in logical blocks (at least
        one prompt token is left to compute) and per group the hit entries its sequences hold."""
        if self.prefix is None:
            return _NO_KEYS, 0, [[] for _ in self.groups]
        keys = block_keys(spec.token_ids, self.block_size)
        num_hit, hits = self.prefix.find_hit(keys, (spec.num_tokens - 1) // self.block_size)
        return keys, num_hit, hits

    def can_append(self, seq_ids: list[int]) -> bool:
        counted = self._count_append(seq_ids)
        return sum(counted.need) <= self.num_allocatable_blocks() + counted.freed

    def append_if_room(self, seq_ids: list[int], token_ids: np.ndarray | None = None) -> AppendResult | None:
        """`append` when the pool can supply it, else None (nothing changed); the batch is counted once."""
        counted = self._count_append(seq_ids)
        if sum(counted.need) > self.num_allocatable_blocks() + counted.freed:
            return None
        return self._append_counted(seq_ids, counted, token_ids)

    def _count_append(self, seq_ids: list[int], release: bool = True) -> _Counted:
        """Pure. What `append` takes in each group and what its windows release first (`_Counted`). An entry's
        units share their holders, so unit 0 stands for the entry. Only a window group releases (unless not
        `release`), and a sequence only when its window passed a block boundary since its last step; a group
        copies only when some sequence's last block is shared, and only then is it counted sequence by
        sequence."""
        self._check_batch(seq_ids)
        refcount, bs = self._refcount, self.block_size
        rows = self.seqs.rows(seq_ids)
        lengths = self.seqs.columns["length"][rows]
        opening = lengths % bs == 0  # [num_seqs] the token opens a new block
        leaving: dict[int, int] = {}  # unit-0 block -> holders leaving it along the batch
        need, freed, passed, shared = [], 0, [], []
        for g in self.groups:
            passed.append(self._passed(g, rows, lengths) if release and g.window_tokens is not None else [])
            first_live = g.first_live
            for k, dead in passed[-1]:
                table = g.entries[seq_ids[k]]
                for i in range(int(first_live[rows[k]]), dead):
                    b = int(table[i][0])
                    leaving[b] = leaving.get(b, 0) + 1
                    freed += g.units if refcount[b] == leaving[b] else 0
            last = g.last[rows]
            shared.append(self._writes_shared(last, opening))
            if not shared[-1]:
                need.append(int(opening.sum()) * g.units)
                continue
            taken = 0
            for b, opens in zip(last.tolist(), opening.tolist(), strict=True):
                if opens:
                    taken += 1
                    continue
                if refcount[b] - leaving.get(b, 0) > 1:  # shared: copy, unless the last holder
                    taken += 1
                    leaving[b] = leaving.get(b, 0) + 1
            need.append(taken * g.units)
        return _Counted(need, freed, rows, lengths, passed, shared)

    def append(self, seq_ids: list[int], token_ids: np.ndarray | None = None) -> AppendResult:
        """Mutates. Window groups first release the blocks the new tokens' queries cannot read; then each
        group gives each sequence one slot (a new block, or a private copy of a shared last block unless
        it is its last holder). Raises RuntimeError, changing nothing, when the pool cannot. With a prefix
        cache, a block this fills is registered in every group (`token_ids` int32 [num_seqs]; None: the
        sequences register nothing more)."""
        return self._append_released(seq_ids, token_ids, True)

    def append_recomputed(self, seq_ids: list[int], token_ids: np.ndarray | None = None) -> AppendResult:
        """Mutates. `append` with nothing released: the windows pass these blocks from the sequences' next step on,
        after the kernel of this one computed the prompt over them (as after any admission)."""
        return self._append_released(seq_ids, token_ids, False)

    def _append_released(self, seq_ids: list[int], token_ids: np.ndarray | None, release: bool) -> AppendResult:
        counted = self._count_append(seq_ids, release)
        allocatable = self.num_allocatable_blocks() + counted.freed
        if sum(counted.need) > allocatable:
            raise RuntimeError(f"out of blocks: append needs {sum(counted.need)}, {allocatable} allocatable")
        return self._append_counted(seq_ids, counted, token_ids)

    def _append_counted(self, seq_ids: list[int], counted: _Counted, token_ids: np.ndarray | None) -> AppendResult:
        """Mutates. `append` of a batch as `_count_append` counted it (allocatable); each group takes its blocks at
        once, in the order the sequences' own takes would give them (`_take_each`). A group where no sequence
        writes into a shared block opens its new blocks over the batch's arrays; otherwise sequence by
        sequence, as copy-on-write depends on the writers before."""
        bs, refcount, rows, lengths = self.block_size, self._refcount, counted.rows, counted.lengths
        opening = lengths % bs == 0
        for gi, (g, passed) in enumerate(zip(self.groups, counted.passed, strict=True)):
            if passed:
                self._release_passed(gi, [g.release_before(seq_ids[k], rows[k], dead) for k, dead in passed])
        slots = np.zeros((len(self.groups), len(seq_ids)), dtype=np.int64)  # [num_groups, num_seqs]
        copies = []
        for gi, g in enumerate(self.groups):
            units, tables = g.units, g.entries
            popped = self._take_each(counted.need[gi], units, gi)
            self._held_blocks[gi] += popped.shape[0]  # new blocks, or private copies (the shared stay held)
            last_column = g.last
            last = last_column[rows]
            if not counted.shared[gi]:
                opened = np.flatnonzero(opening)
                fresh_rows = popped.reshape(opened.shape[0], units)  # [num_opened, units]
                refcount[popped] = 1
                for k, fresh in zip(opened.tolist(), fresh_rows, strict=True):
                    tables[seq_ids[k]].append(fresh)
                last[opened] = fresh_rows[:, 0]
                last_column[rows[opened]] = last[opened]
                slots[gi] = last * bs + lengths % bs
                continue
            taken = 0
            for k, (seq_id, row, length) in enumerate(zip(seq_ids, rows.tolist(), lengths.tolist(), strict=True)):
                table = tables[seq_id]
                if length % bs == 0 or refcount[last_column[row]] > 1:
                    fresh, taken = popped[taken:taken + units], taken + units
                    refcount[fresh] = 1
                    if length % bs == 0:
                        table.append(fresh)
                    else:
                        refcount[table[-1]] -= 1
                        copies.append(np.stack([table[-1], fresh], axis=1))
                        table[-1] = fresh
                    last_column[row] = fresh[0]
                slots[gi, k] = last_column[row] * bs + length % bs
        self.seqs.columns["length"][rows] = lengths + 1
        if self.prefix is not None:
            self.prefix.register_filled(seq_ids, token_ids)
        pairs = np.concatenate(copies).astype(np.int32) if copies else _NO_COPIES
        return AppendResult(slots=slots[0].copy(), copies=pairs, group_slots=slots)

    def _writes_shared(self, last: np.ndarray, opening: np.ndarray) -> bool:
        """Pure. Some sequence that does not open a block writes into its last block (`last`, a group's) while
        that block has other holders (it may copy): the step must then be taken sequence by sequence."""
        return bool(np.any(self._refcount[last[~opening]] > 1))

    def _passed(self, g: GroupTables, rows: np.ndarray, lengths: np.ndarray) -> list[tuple[int, int]]:
        """Pure. (batch index, `g.dead_before` its length) of each sequence of a window group whose window passed
        a block boundary since it last released, batch order (a table holds cdiv(length, block) entries)."""
        bs = self.block_size
        dead = np.minimum(g.dead_before(lengths), cdiv(lengths, bs))
        passed = np.flatnonzero(dead > g.first_live[rows])
        return list(zip(passed.tolist(), dead[passed].tolist(), strict=True))

    def _release_passed(self, group: int, runs: list[list[np.ndarray]]) -> None:
        """Mutates. `_drop` of each sequence's released entries (`runs`, batch order), in one call when no entry
        is in two runs: the runs concatenated last sequence first leave the free stack and the cache's order
        as the calls one by one would (each pushes its blocks on top; the cache takes each run tail first)."""
        entries = [e for run in reversed(runs) for e in run]
        if len({int(e[0]) for e in entries}) == len(entries):
            self._drop(entries, group)
            return
        for run in runs:  # an entry leaves two holders: its last one is the one that frees it
            self._drop(run, group)

    def _take_each(self, k: int, units: int, group: int) -> np.ndarray:
        """Mutates. What k // units successive `_take(units, group)` calls return, concatenated, int32 [k]: the
        takes the free stack covers pop at once (the same blocks, top first); with the stack empty and every
        group's entries `units` wide, each take would evict the policy's next entry and take it whole, so the
        rest evict at once in policy order (nothing reorders the policy between them); otherwise one take."""
        parts = []
        while k:
            direct = min(self._free.size // units * units, k)
            if direct:
                parts.append(self._take(direct, group))
                k -= direct
            elif self._free.size == 0 and self._uniform and self.prefix is not None:
                blocks = np.concatenate(self.prefix.evict(k // units))
                self.prefix_evicted_blocks += blocks.shape[0]
                self._group_of_block[blocks] = group
                parts.append(blocks)
                k = 0
            else:
                parts.append(self._take(units, group))
                k -= units
        return parts[0] if len(parts) == 1 else np.concatenate(parts or [_NO_BLOCKS])

    def fork(self, parent_id: int, child_id: int) -> AdmitResult:
        """Mutates. The child shares every held entry of the parent in every group."""
        if parent_id not in self.seqs or child_id in self.seqs:
            raise ValueError(f"cannot fork {parent_id} into {child_id}: parent unknown or child live")
        child = self.seqs.add(child_id)
        parent = self.seqs.row(parent_id)
        for column in self.seqs.columns.values():  # length, final length, each group's first and last entries
            column[child] = column[parent]
        for g in self.groups:
            g.entries[child_id] = list(g.entries[parent_id])
            self._refcount[g.held_blocks(child_id)] += 1
        if self.prefix is not None:
            self.prefix.fork(parent_id, child_id)
        return AdmitResult(True)

    def free(self, seq_id: int) -> None:
        """Mutates. Blocks no other sequence holds go back to the free stack (or the prefix cache), each
        group's tail first (vLLM v1 frees group by group, each in reverse)."""
        if seq_id not in self.seqs:
            raise ValueError(f"sequence {seq_id} is not live")
        for gi, g in enumerate(self.groups):
            self._drop(g.live(seq_id), gi)
            del g.entries[seq_id]
        self.seqs.remove(seq_id)

    def _drop(self, entries: list[np.ndarray], group: int) -> None:
        """Mutates. One holder fewer for each entry of `group` (its units' blocks each, distinct, in table
        order); an entry at 0 holders goes to the prefix cache when registered there, else to the free stack."""
        if not entries:
            return
        units = self.groups[group].units
        blocks = np.concatenate(entries)
        self._refcount[blocks] -= 1
        heads = blocks[::units]  # [num_entries] unit 0 of each
        unheld = self._refcount[heads] == 0
        num_unheld = int(np.count_nonzero(unheld))
        self._held_blocks[group] -= num_unheld * units
        if self.prefix is None:
            self._free.push(blocks[self._refcount[blocks] == 0])
            return
        if not num_unheld:
            return
        picked = [e for e, zero in zip(entries, unheld.tolist(), strict=True) if zero]
        back = self.prefix.release(picked, heads[unheld], units)
        if back:
            self._free.push(np.concatenate(back))

    def _take(self, k: int, group: int) -> np.ndarray:
        """Mutates. k blocks for new content of `group`, int32 [k]; the caller sets their refcounts. Free
        blocks go first; cached entries are evicted (every unit, the surplus to the free stack) only when
        short, as few as cover the shortfall, in policy order. They are evicted in batches no larger than
        the fewest entries that could cover what is still short (entries of the largest group), so no more
        go than one at a time would take, and the free stack ends as those one-at-a-time pushes leave it."""
        if self.prefix is not None and self._free.size < k:
            widest = max(g.units for g in self.groups)
            evicted: list[np.ndarray] = []
            short = k - self._free.size
            while short > 0:
                entries = self.prefix.evict(cdiv(short, widest))
                evicted += entries
                short -= sum(map(len, entries))
            blocks = np.concatenate(evicted[::-1])  # the last evicted on top, as pushed one by one
            self.prefix_evicted_blocks += blocks.shape[0]
            self._free.push(blocks)
        taken = self._free.pop(k)
        self._group_of_block[taken] = group
        return taken

    def group_slot_mapping(self, group: int, seq_id: int, start: int, stop: int) -> np.ndarray:
        """Slots (unit 0) of positions [start, stop) in one group's table, int64 [stop - start]."""
        return self.groups[group].slot_mapping(seq_id, start, stop)

    def slot_mapping(self, seq_id: int, start: int, stop: int) -> np.ndarray:
        raise TypeError("a hybrid pool has one table per layer group: use group_slot_mapping")

    def describe_group(self, group: int, seq_ids: list[int]) -> PagedDescriptor:
        """One group's kernel view of these sequences: unit-0 ids of every logical block (released ones as
        a placeholder its windowed kernel never reads)."""
        self._check_batch(seq_ids)
        g = self.groups[group]
        tables = [g.kernel_table(s) for s in seq_ids]
        indptr = np.zeros(len(seq_ids) + 1, dtype=np.int32)
        indptr[1:] = np.cumsum([t.shape[0] for t in tables])
        lengths = self.seqs.columns["length"][self.seqs.rows(seq_ids)].astype(np.int32)
        return PagedDescriptor(kv_indptr=indptr, kv_indices=np.concatenate(tables) if tables else indptr[:0],
                               kv_last_page_len=lengths - (indptr[1:] - indptr[:-1] - 1) * self.block_size,
                               block_size=self.block_size)

    def describe(self, seq_ids: list[int]) -> PagedDescriptor:
        raise TypeError("a hybrid pool has one table per layer group: use describe_group")

    def windows(self) -> list[int | None]:
        return [g.window_tokens for g in self.groups]

    def length(self, seq_id: int) -> int:
        return int(self.seqs.columns["length"][self.seqs.row(seq_id)])

    def final_len(self, seq_id: int) -> int:
        return int(self.seqs.columns["final_len"][self.seqs.row(seq_id)])

    @property
    def refcount(self) -> np.ndarray:
        """Holders of each pool block over every group's tables, int32 [num_blocks] (read only)."""
        return self._refcount

    def held_blocks(self) -> list[int]:
        """Per group, the blocks some sequence holds (a copy)."""
        return list(self._held_blocks)

    def group_of_block(self) -> np.ndarray:
        """The group each block was last taken for, int64 [num_blocks] (read only; meaningful for held and
        cached blocks)."""
        return self._group_of_block

    def free_block_ids(self) -> np.ndarray:
        """The free stack (a copy), int32 [num_free]."""
        return self._free.ids()

    # -- accounting -------------------------------------------------------------------------------

    def group_snapshots(self) -> list[GroupSnapshot]:
        """Pure. Each group's held slots split as in `paged`: an unwritten slot of a held block is reserved
        if some holder will write it, else internal fragmentation. Only a sequence's last block can be
        partly written (holders of a shared block see the same fill), so every other held block is all
        token: the held count is kept as blocks change, the rest is O(sequences)."""
        return self._group_parts()[0]

    def _group_parts(self) -> tuple[list[GroupSnapshot], int]:
        """Pure. `group_snapshots`, and the entries of a group's tables (each holds cdiv(length, block) entries
        of a sequence, released ones included)."""
        bs, columns, live = self.block_size, self.seqs.columns, self.seqs.live
        out, entries = [], 0
        for gi, g in enumerate(self.groups):
            # each sequence's last block in the group is held (a window never releases the block being written)
            num_last, written, reserved, held_entries, logical, entries = last_block_parts(
                live, columns["length"], columns["final_len"], g.last, g.first_live, bs, self._reach_of)
            held = self._held_blocks[gi] // g.units * bs
            token = held - bs * num_last + written  # every held block but the last ones is full
            out.append(GroupSnapshot(g.window_tokens, token * g.units, reserved * g.units,
                                     (held - token - reserved) * g.units, held * g.units, logical * g.units,
                                     held_entries * bs * g.units))
        return out, entries

    def snapshot(self, refused_extent_slots: int = 0) -> Snapshot:
        """Pure. The groups' parts summed; free blocks serve any request (no external fragmentation)."""
        del refused_extent_slots
        groups, entries_per_group = self._group_parts()
        free = self._free.size * self.block_size
        cached = 0 if self.prefix is None else self.prefix.cached_blocks * self.block_size
        entries = len(self.groups) * entries_per_group
        return Snapshot(
            capacity_slots=self.capacity_slots, token_slots=sum(g.token_slots for g in groups),
            reserved_slots=sum(g.reserved_slots for g in groups),
            internal_frag_slots=sum(g.internal_frag_slots for g in groups), cached_slots=cached,
            external_frag_slots=0, free_slots=free,
            logical_token_slots=sum(g.logical_token_slots for g in groups),
            block_table_bytes=_BLOCK_TABLE_ENTRY_BYTES * entries, largest_free_extent_slots=free,
            num_free_blocks=self.num_allocatable_blocks(), groups=tuple(groups))

    # -- swap: not supported ------------------------------------------------------------------------

    def extend(self, seq_ids: list[int], token_ids: np.ndarray) -> AdmitResult:
        raise ValueError("the hybrid pool has no chunked admission; the config refuses --chunked-prefill with it")

    def can_swap_out(self, seq_ids: list[int]) -> bool:
        return False

    def swap_out(self, seq_ids: list[int]) -> SwapResult:
        raise RuntimeError("the hybrid pool does not swap; preempt by recompute")

    def can_swap_in(self, seq_ids: list[int]) -> bool:
        return False

    def swap_in(self, seq_ids: list[int]) -> SwapResult:
        raise RuntimeError("the hybrid pool does not swap; preempt by recompute")

    # -- checks -----------------------------------------------------------------------------------

    def _check_new(self, seq_ids: list[int], spec: SeqSpec) -> None:
        if not seq_ids:
            raise ValueError("admit needs at least one sequence id")
        if not 1 <= spec.num_tokens <= spec.final_len <= self.max_model_len:
            raise ValueError(f"need 1 <= num_tokens ({spec.num_tokens}) <= final_len ({spec.final_len}) "
                             f"<= max_model_len ({self.max_model_len})")
        if len(set(seq_ids)) != len(seq_ids) or not self.seqs.none_live(seq_ids):
            raise ValueError(f"sequence ids {seq_ids} repeat or are already live")

    def _check_batch(self, seq_ids: list[int]) -> None:
        batch = set(seq_ids)
        if len(batch) != len(seq_ids):
            raise ValueError("a sequence id repeats in the batch")
        if not self.seqs.all_live(batch):
            raise ValueError(f"sequence {next(s for s in seq_ids if s not in self.seqs)} is not live")

    def check_integrity(self) -> None:
        """Raise AssertionError naming the first broken invariant (`paged.hybrid_integrity`)."""
        check_hybrid(self)
