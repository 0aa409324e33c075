"""Contiguous reservation (Orca / FasterTransformer style): one extent per sequence, fixed at admission.

A subclass only says how many slots to reserve for a sequence of a given final length
(`reservation_slots`); the placer (`fit = first | best | buddy`) decides where. Block size is 1, so
a slot is a block and a copy pair copies one slot.

Accounting (all counters kept incrementally, so `snapshot` is O(number of free extents)):
- token = slots written = sum of lengths (nothing is shared);
- reserved = sum of (final_len - length): the reservation always covers the final length;
- internal = sum of (allocated extent - final_len): over-reservation plus the buddy round-up;
- external = when the caller was refused an extent of `refused_extent_slots`, the free slots lying
  in free extents smaller than that; free = the rest.
Parallel sampling needs one extent per sample (all or nothing) and delivers the prompt's KV to
samples 2..n as copies from the first extent; a fork is a new extent plus a copy of the parent's KV.
Swap is not supported (preempt by recompute).
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.base import AdmitResult, AppendResult, ContiguousDescriptor, SeqSpec, Snapshot, SwapResult
from workbench.allocators.extents import make_placer
from workbench.allocators.seq_rows import SeqRows

_NO_COPIES = np.zeros((0, 2), dtype=np.int32)
_EXTENT_DESCRIPTOR_BYTES = 8  # int32 kv_start + int32 kv_len per sequence


class ContiguousStrategy:
    kernel_mode = "contiguous"
    block_size = 1
    supports_swap = False
    name = "contiguous"

    def __init__(self, *, capacity_slots: int, max_model_len: int, fit: str = "first", block_size: int = 1,
                 swap_slots: int = 0) -> None:
        del block_size, swap_slots  # one slot per block; extents are not swapped
        if capacity_slots < 1 or max_model_len < 1:
            raise ValueError(f"capacity_slots ({capacity_slots}) and max_model_len ({max_model_len}) must be >= 1")
        self.capacity_slots = capacity_slots
        self.max_model_len = max_model_len
        self.fit = fit
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        self._placer = make_placer(fit, capacity_slots)
        self._seqs = SeqRows(("start", "alloc", "length", "final_len"))
        self._token_slots = 0
        self._final_slots = 0  # sum of final_len over live sequences
        self._alloc_slots = 0  # sum of allocated extent sizes

    def reservation_slots(self, final_len: int) -> int:
        """Slots to reserve for a sequence that will reach `final_len` (>= final_len, <= max_model_len)."""
        raise NotImplementedError

    def admit(self, seq_ids: list[int], spec: SeqSpec) -> AdmitResult:
        """Mutates on success: one extent per sequence, placed all or nothing."""
        if not seq_ids or len(set(seq_ids)) != len(seq_ids) or any(s in self._seqs for s in seq_ids):
            raise ValueError(f"sequence ids {seq_ids} are empty, repeat or are already live")
        if not 1 <= spec.num_tokens <= spec.final_len <= self.max_model_len:
            raise ValueError(f"need 1 <= num_tokens ({spec.num_tokens}) <= final_len ({spec.final_len}) "
                             f"<= max_model_len ({self.max_model_len})")
        extents = self._place_all(len(seq_ids), spec.final_len)
        if extents is None:
            needed = self._placer.alloc_size(self.reservation_slots(spec.final_len))
            return AdmitResult(False, needed_extent_slots=needed,
                               reason=f"no free extent of {needed} slots for each of {len(seq_ids)} sequences")
        for seq_id, (start, alloc) in zip(seq_ids, extents, strict=True):
            self._add(seq_id, start, alloc, spec.num_tokens, spec.final_len)
        first = extents[0][0]
        copies = [_copy_pairs(first, start, spec.num_tokens) for start, _ in extents[1:]]
        return AdmitResult(True, copies=np.concatenate(copies) if copies else None)

    def fork(self, parent_id: int, child_id: int) -> AdmitResult:
        """Mutates on success: a new extent for the child and copies of the parent's written slots."""
        if child_id in self._seqs:
            raise ValueError(f"sequence {child_id} is already live")
        parent = self._seqs.row(parent_id)
        length, final_len = (int(self._seqs.column(c)[parent]) for c in ("length", "final_len"))
        extents = self._place_all(1, final_len)
        if extents is None:
            needed = self._placer.alloc_size(self.reservation_slots(final_len))
            return AdmitResult(False, needed_extent_slots=needed, reason=f"no free extent of {needed} slots")
        start, alloc = extents[0]
        self._add(child_id, start, alloc, length, final_len)
        return AdmitResult(True, copies=_copy_pairs(int(self._seqs.column("start")[parent]), start, length))

    def free(self, seq_id: int) -> None:
        """Mutates. The extent returns to the free space."""
        row = self._seqs.row(seq_id)
        start, alloc, length, final_len = (int(self._seqs.column(c)[row])
                                           for c in ("start", "alloc", "length", "final_len"))
        self._placer.release(start, alloc)
        self._token_slots -= length
        self._final_slots -= final_len
        self._alloc_slots -= alloc
        self._seqs.remove(seq_id)

    def can_append(self, seq_ids: list[int]) -> bool:
        self._check_appendable(seq_ids, self._seqs.rows(seq_ids))
        return True  # the extent already covers the final length

    def append(self, seq_ids: list[int]) -> AppendResult:
        """Mutates. The next slot of each extent."""
        rows = self._seqs.rows(seq_ids)
        self._check_appendable(seq_ids, rows)
        lengths = self._seqs.column("length")
        slots = self._seqs.column("start")[rows] + lengths[rows]
        lengths[rows] += 1
        self._token_slots += rows.shape[0]
        return AppendResult(slots=slots, copies=_NO_COPIES)

    def slot_mapping(self, seq_id: int, start: int, stop: int) -> np.ndarray:
        row = self._seqs.row(seq_id)
        length = int(self._seqs.column("length")[row])
        if not 0 <= start <= stop <= length:
            raise ValueError(f"positions [{start}, {stop}) outside sequence {seq_id} of {length} tokens")
        return self._seqs.column("start")[row] + np.arange(start, stop, dtype=np.int64)

    def describe(self, seq_ids: list[int]) -> ContiguousDescriptor:
        rows = self._seqs.rows(seq_ids)
        return ContiguousDescriptor(kv_start=self._seqs.column("start")[rows].astype(np.int32),
                                    kv_len=self._seqs.column("length")[rows].astype(np.int32))

    def snapshot(self, refused_extent_slots: int = 0) -> Snapshot:
        """Pure. O(number of free extents)."""
        sizes = self._placer.free_sizes()
        external = int(sizes[sizes < refused_extent_slots].sum()) if refused_extent_slots > 0 else 0
        used = self._alloc_slots
        return Snapshot(
            capacity_slots=self.capacity_slots, token_slots=self._token_slots,
            reserved_slots=self._final_slots - self._token_slots,
            internal_frag_slots=self._alloc_slots - self._final_slots, cached_slots=0,
            external_frag_slots=external, free_slots=self.capacity_slots - used - external,
            logical_token_slots=self._token_slots, block_table_bytes=_EXTENT_DESCRIPTOR_BYTES * len(self._seqs),
            largest_free_extent_slots=int(sizes.max()) if sizes.shape[0] else 0,
            num_free_blocks=self._placer.free_slots)

    def can_swap_out(self, seq_ids: list[int]) -> bool:
        return False

    def swap_out(self, seq_ids: list[int]) -> SwapResult:
        raise NotImplementedError(f"{self.name} does not swap: preempt by recompute")

    def can_swap_in(self, seq_ids: list[int]) -> bool:
        return False

    def swap_in(self, seq_ids: list[int]) -> SwapResult:
        raise NotImplementedError(f"{self.name} does not swap: preempt by recompute")

    def check_integrity(self) -> None:
        """Pure. Extents and free space tile the slot space exactly; counters match a recount."""
        live = np.flatnonzero(self._seqs.live)
        col = {c: self._seqs.column(c)[live] for c in ("start", "alloc", "length", "final_len")}
        if not (np.all(col["length"] >= 1) and np.all(col["length"] <= col["final_len"])
                and np.all(col["final_len"] <= col["alloc"])):
            raise AssertionError("1 <= length <= final_len <= extent broken")
        free_starts, free_sizes = self._placer.free_extents()
        starts = np.concatenate([col["start"], free_starts])
        sizes = np.concatenate([col["alloc"], free_sizes])
        order = np.argsort(starts, kind="stable")
        ends = np.cumsum(sizes[order])
        if not (np.array_equal(starts[order], np.concatenate([[0], ends[:-1]])) and ends[-1] == self.capacity_slots):
            raise AssertionError("extents and free space overlap or leave a gap")
        self._placer.check()
        if (int(col["length"].sum()), int(col["final_len"].sum()), int(col["alloc"].sum()),
                int(free_sizes.sum())) != (self._token_slots, self._final_slots, self._alloc_slots,
                                           self._placer.free_slots):
            raise AssertionError("slot counters differ from a recount")

    def _place_all(self, n: int, final_len: int) -> list[tuple[int, int]] | None:
        """Mutates only on success: n extents, or None with the free space unchanged."""
        size = self.reservation_slots(final_len)
        placed = []
        for _ in range(n):
            extent = self._placer.place(size)
            if extent is None:
                for start, alloc in reversed(placed):  # canonical free space: rollback is exact
                    self._placer.release(start, alloc)
                return None
            placed.append(extent)
        return placed

    def _add(self, seq_id: int, start: int, alloc: int, length: int, final_len: int) -> None:
        row = self._seqs.add(seq_id)
        for name, value in (("start", start), ("alloc", alloc), ("length", length), ("final_len", final_len)):
            self._seqs.column(name)[row] = value
        self._token_slots += length
        self._final_slots += final_len
        self._alloc_slots += alloc

    def _check_appendable(self, seq_ids: list[int], rows: np.ndarray) -> None:
        if np.unique(rows).shape[0] != rows.shape[0]:
            raise ValueError(f"a sequence id repeats in the batch {seq_ids}")
        over = self._seqs.column("length")[rows] >= self._seqs.column("final_len")[rows]
        if over.any():
            raise ValueError(f"append past final_len for sequences {[seq_ids[i] for i in np.flatnonzero(over)]}")


def _copy_pairs(src_start: int, dst_start: int, num_slots: int) -> np.ndarray:
    """(src, dst) slot pairs copying num_slots slots, int32 [num_slots, 2]."""
    offsets = np.arange(num_slots, dtype=np.int32)
    return np.stack([src_start + offsets, dst_start + offsets], axis=1)
