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
Swap moves a sequence's written slots to an extent of a first-fit host space of `swap_slots` and
releases its device extent; swap-in places a fresh reservation. Swapped sequences count in no device
column (and not in logical_token_slots).
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.base import Strategy
from workbench.allocators.batch_check import raise_for_status
from workbench.allocators.contiguous import loops as contiguous_loops
from workbench.allocators.contiguous.extents import RunPlacer, make_placer
from workbench.allocators.seq_rows import SeqRows
from workbench.allocators.values import AdmitResult, AppendResult, ContiguousDescriptor, SeqSpec, Snapshot, SwapResult

_NO_COPIES = np.zeros((0, 2), dtype=np.int32)
_EXTENT_DESCRIPTOR_BYTES = 8  # int32 kv_start + int32 kv_len per sequence


class ContiguousStrategy(Strategy):
    kernel_mode = "contiguous"
    block_size = 1
    supports_swap = True
    wants_token_ids = False
    needs_prompt_ids = False
    name = "contiguous"

    def __init__(self, *, capacity_slots: int, max_model_len: int, fit: str = "first", block_size: int = 1,
                 swap_slots: int = 0) -> None:
        del block_size  # one slot per block
        if capacity_slots < 1 or max_model_len < 1 or swap_slots < 0:
            raise ValueError(f"need capacity_slots ({capacity_slots}) >= 1, max_model_len ({max_model_len}) >= 1, "
                             f"swap_slots ({swap_slots}) >= 0")
        self.capacity_slots = capacity_slots
        self.max_model_len = max_model_len
        self.fit = fit
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        self.prefix_evicted_blocks = 0
        self._placer = make_placer(fit, capacity_slots)
        self._host = RunPlacer(swap_slots, best=False) if swap_slots else None
        self._seqs = SeqRows(("start", "alloc", "length", "final_len", "swapped", "host_start", "mark"))
        # counters over on-device sequences
        self._num_on_device = 0
        self._token_slots = 0  # sum of lengths
        self._final_slots = 0  # sum of final lengths
        self._alloc_slots = 0  # sum of allocated extent sizes

    def reservation_slots(self, final_len: int, num_tokens: int) -> int:
        """Slots to reserve for a sequence that holds `num_tokens` when placed and will reach
        `final_len` (>= final_len, <= max_model_len)."""
        raise NotImplementedError

    def admit(self, seq_ids: list[int], spec: SeqSpec) -> AdmitResult:
        """Mutates on success: one extent per sequence, placed all or nothing."""
        if not seq_ids or len(set(seq_ids)) != len(seq_ids) or any(s in self._seqs for s in seq_ids):
            raise ValueError(f"sequence ids {seq_ids} are empty, repeat or are already live")
        if not 1 <= spec.num_tokens <= spec.final_len <= self.max_model_len:
            raise ValueError(f"need 1 <= num_tokens ({spec.num_tokens}) <= final_len ({spec.final_len}) "
                             f"<= max_model_len ({self.max_model_len})")
        reserve = self.reservation_slots(spec.final_len, spec.num_tokens)
        extents = _place_all(self._placer, [reserve] * len(seq_ids))
        if extents is None:
            needed = self._placer.alloc_size(reserve)
            return AdmitResult(False, needed_extent_slots=needed,
                               reason=f"no free extent of {needed} slots for each of {len(seq_ids)} sequences")
        held = spec.num_held(0)  # no prefix cache: a chunked admission holds its first chunk
        for seq_id, (start, alloc) in zip(seq_ids, extents, strict=True):
            self._add(seq_id, start, alloc, held, spec.final_len)
        first = extents[0][0]
        copies = [_copy_pairs(first, start, held) for start, _ in extents[1:]]
        return AdmitResult(True, copies=np.concatenate(copies) if copies else None)

    def extend(self, seq_ids: list[int], token_ids: np.ndarray) -> AdmitResult:
        """Mutates. The group's extents already cover the final length: never refused. Copies deliver
        the new tokens from the first sequence's extent to the others', as admission does."""
        rows = self._group_rows(seq_ids, swapped=False)
        c = self._seqs.column
        length, k = int(c("length")[rows[0]]), token_ids.shape[0]
        if not np.all(c("length")[rows] == length):
            raise ValueError(f"sequences {seq_ids} hold different lengths: not one group being prefilled")
        if length + k > int(c("final_len")[rows].min()):
            raise ValueError(f"extending {seq_ids} by {k} tokens passes their final length")
        c("length")[rows] += k
        self._token_slots += rows.shape[0] * k
        first = int(c("start")[rows[0]]) + length
        copies = [_copy_pairs(first, int(c("start")[row]) + length, k) for row in rows[1:].tolist()]
        return AdmitResult(True, copies=np.concatenate(copies) if copies else None)

    def fork(self, parent_id: int, child_id: int) -> AdmitResult:
        """Mutates on success: a new extent for the child and copies of the parent's written slots."""
        if child_id in self._seqs:
            raise ValueError(f"sequence {child_id} is already live")
        parent = self._seqs.row(parent_id)
        if self._seqs.column("swapped")[parent]:
            raise ValueError(f"cannot fork sequence {parent_id}: it is swapped out")
        length, final_len = (int(self._seqs.column(c)[parent]) for c in ("length", "final_len"))
        extents = _place_all(self._placer, [self.reservation_slots(final_len, length)])
        if extents is None:
            needed = self._placer.alloc_size(self.reservation_slots(final_len, length))
            return AdmitResult(False, needed_extent_slots=needed, reason=f"no free extent of {needed} slots")
        start, alloc = extents[0]
        self._add(child_id, start, alloc, length, final_len)
        return AdmitResult(True, copies=_copy_pairs(int(self._seqs.column("start")[parent]), start, length))

    def free(self, seq_id: int) -> None:
        """Mutates. The extent returns to the free space."""
        row = self._seqs.row(seq_id)
        if self._seqs.column("swapped")[row]:
            self._host.release(int(self._seqs.column("host_start")[row]), int(self._seqs.column("length")[row]))
        else:
            self._leave_device(row)
        self._seqs.remove(seq_id)

    def can_append(self, seq_ids: list[int]) -> bool:
        self._append(seq_ids, apply=False)
        return True  # the extent already covers the final length

    def append(self, seq_ids: list[int], token_ids: np.ndarray | None = None) -> AppendResult:
        """Mutates. The next slot of each extent; `token_ids` is ignored (no prefix cache)."""
        del token_ids
        return AppendResult(slots=self._append(seq_ids, apply=True), copies=_NO_COPIES)

    def append_if_room(self, seq_ids: list[int], token_ids: np.ndarray | None = None) -> AppendResult:
        """`append`: an extent covers its final length from placement on, so there is always room. One checked
        pass over the batch, not `can_append`'s and then `append`'s."""
        return self.append(seq_ids, token_ids)

    supports_drafts = True

    def _drop_tail(self, seq_ids: list[int], num_slots: np.ndarray) -> None:
        """Mutates. The lengths shrink; each extent keeps its reservation (the slots become reserved again)."""
        rows = self._seqs.rows(seq_ids)
        self._seqs.column("length")[rows] -= num_slots
        self._token_slots -= int(num_slots.sum())

    def slot_mapping(self, seq_id: int, start: int, stop: int) -> np.ndarray:
        row = self._seqs.row(seq_id)
        length = int(self._seqs.column("length")[row])
        if not 0 <= start <= stop <= length:
            raise ValueError(f"positions [{start}, {stop}) outside sequence {seq_id} of {length} tokens")
        if self._seqs.column("swapped")[row]:
            raise ValueError(f"sequence {seq_id} is swapped out")
        return self._seqs.column("start")[row] + np.arange(start, stop, dtype=np.int64)

    def describe(self, seq_ids: list[int]) -> ContiguousDescriptor:
        rows = self._seqs.rows(seq_ids)
        if self._seqs.column("swapped")[rows].any():
            raise ValueError("cannot describe a swapped-out sequence")
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
            logical_token_slots=self._token_slots, block_table_bytes=_EXTENT_DESCRIPTOR_BYTES * self._num_on_device,
            largest_free_extent_slots=int(sizes.max()) if sizes.shape[0] else 0,
            num_free_blocks=self.num_allocatable_blocks())

    def num_allocatable_blocks(self) -> int:
        """Free slots (a slot is a block here), wherever they lie. Pure, O(1)."""
        return self._placer.free_slots

    def can_swap_out(self, seq_ids: list[int]) -> bool:
        rows = self._group_rows(seq_ids, swapped=False)
        return self._host is not None and _fits(self._host, self._seqs.column("length")[rows].tolist())

    def swap_out(self, seq_ids: list[int]) -> SwapResult:
        """Mutates. Each sequence's written slots move to one host extent; device extents are released.
        Raises RuntimeError, changing nothing, when the host space cannot take the group."""
        rows = self._group_rows(seq_ids, swapped=False)
        c = self._seqs.column
        lengths = c("length")[rows].tolist()
        extents = _place_all(self._host, lengths) if self._host is not None else None
        if extents is None:
            raise RuntimeError(f"cannot swap out {seq_ids}: no host extents for {lengths} slots")
        moves = []
        for row, (host_start, length) in zip(rows.tolist(), extents, strict=True):
            moves.append(_copy_pairs(int(c("start")[row]), host_start, length))
            self._leave_device(row)
            c("swapped")[row] = 1
            c("host_start")[row] = host_start
        return SwapResult(moves=np.concatenate(moves))

    def can_swap_in(self, seq_ids: list[int]) -> bool:
        rows = self._group_rows(seq_ids, swapped=True)
        return _fits(self._placer, self._reservations(rows))

    def swap_in(self, seq_ids: list[int]) -> SwapResult:
        """Mutates. Each sequence gets a fresh reservation and its written slots back."""
        rows = self._group_rows(seq_ids, swapped=True)
        c = self._seqs.column
        extents = _place_all(self._placer, self._reservations(rows))
        if extents is None:
            raise RuntimeError(f"cannot swap in {seq_ids}: no free extents")
        moves = []
        for row, (start, alloc) in zip(rows.tolist(), extents, strict=True):
            length = int(c("length")[row])
            moves.append(_copy_pairs(int(c("host_start")[row]), start, length))
            self._host.release(int(c("host_start")[row]), length)
            c("swapped")[row] = 0
            self._enter_device(row, start, alloc)
        return SwapResult(moves=np.concatenate(moves))

    def check_integrity(self) -> None:
        """Pure. Extents and free space tile the device (and host) slot space exactly; counters match
        a recount."""
        live = np.flatnonzero(self._seqs.live)
        col = {c: self._seqs.column(c)[live] for c in ("start", "alloc", "length", "final_len", "swapped",
                                                        "host_start")}
        if not (np.all(col["length"] >= 1) and np.all(col["length"] <= col["final_len"])
                and np.all(col["final_len"] <= self.max_model_len)):
            raise AssertionError("1 <= length <= final_len <= max_model_len broken")
        dev = col["swapped"] == 0
        if not np.all(col["final_len"][dev] <= col["alloc"][dev]):
            raise AssertionError("an extent is shorter than its sequence's final length")
        _check_tiling(self._placer, col["start"][dev], col["alloc"][dev], "device")
        if self._host is not None:
            _check_tiling(self._host, col["host_start"][~dev], col["length"][~dev], "host")
        recount = (int(dev.sum()), int(col["length"][dev].sum()), int(col["final_len"][dev].sum()),
                   int(col["alloc"][dev].sum()))
        if recount != (self._num_on_device, self._token_slots, self._final_slots, self._alloc_slots):
            raise AssertionError(f"slot counters differ from a recount {recount}")

    def _reservations(self, rows: np.ndarray) -> list[int]:
        c = self._seqs.column
        return [self.reservation_slots(int(f), int(n)) for f, n in zip(c("final_len")[rows], c("length")[rows],
                                                                        strict=True)]

    def _add(self, seq_id: int, start: int, alloc: int, length: int, final_len: int) -> None:
        row = self._seqs.add(seq_id)
        self._seqs.column("length")[row] = length
        self._seqs.column("final_len")[row] = final_len
        self._enter_device(row, start, alloc)

    def _enter_device(self, row: int, start: int, alloc: int) -> None:
        c = self._seqs.column
        c("start")[row] = start
        c("alloc")[row] = alloc
        self._num_on_device += 1
        self._token_slots += int(c("length")[row])
        self._final_slots += int(c("final_len")[row])
        self._alloc_slots += alloc

    def _leave_device(self, row: int) -> None:
        """Mutates. Release the row's device extent and its share of the counters."""
        c = self._seqs.column
        self._placer.release(int(c("start")[row]), int(c("alloc")[row]))
        self._num_on_device -= 1
        self._token_slots -= int(c("length")[row])
        self._final_slots -= int(c("final_len")[row])
        self._alloc_slots -= int(c("alloc")[row])

    def _group_rows(self, seq_ids: list[int], swapped: bool) -> np.ndarray:
        rows = self._seqs.rows(seq_ids)
        if np.unique(rows).shape[0] != rows.shape[0]:
            raise ValueError(f"a sequence id repeats in the group {seq_ids}")
        if not np.all(self._seqs.column("swapped")[rows] == int(swapped)):
            raise ValueError(f"every sequence of {seq_ids} must be {'swapped out' if swapped else 'on the device'}")
        return rows

    def _append(self, seq_ids: list[int], apply: bool) -> np.ndarray:
        """Mutates if `apply`. Slots of the batch's next tokens, int64 [num_seqs]; raises ValueError
        for a repeated, swapped-out or finished sequence."""
        rows = self._seqs.rows(seq_ids)
        c = self._seqs.column
        slots = np.empty(rows.shape[0], dtype=np.int64)
        status, bad = contiguous_loops.append_extents(rows, c("start"), c("length"), c("final_len"), c("swapped"),
                                                      c("mark"), slots, apply)
        if status:
            raise_for_status(status, seq_ids, bad)
        if apply:
            self._token_slots += rows.shape[0]
        return slots


def _copy_pairs(src_start: int, dst_start: int, num_slots: int) -> np.ndarray:
    """(src, dst) slot pairs copying num_slots slots, int32 [num_slots, 2]."""
    offsets = np.arange(num_slots, dtype=np.int32)
    return np.stack([src_start + offsets, dst_start + offsets], axis=1)


def _place_all(placer, sizes: list[int]) -> list[tuple[int, int]] | None:
    """Mutates only on success: one extent per size, or None with the free space unchanged."""
    placed = []
    for size in sizes:
        extent = placer.place(size)
        if extent is None:
            for start, alloc in reversed(placed):  # canonical free space: the rollback is exact
                placer.release(start, alloc)
            return None
        placed.append(extent)
    return placed


def _fits(placer, sizes: list[int]) -> bool:
    """Pure: whether `_place_all(placer, sizes)` would succeed."""
    placed = _place_all(placer, sizes)
    for start, alloc in reversed(placed or []):
        placer.release(start, alloc)
    return placed is not None


def _check_tiling(placer, starts: np.ndarray, sizes: np.ndarray, space: str) -> None:
    """Raise AssertionError unless the extents and the placer's free space tile its slot space."""
    free_starts, free_sizes = placer.free_extents()
    starts = np.concatenate([starts, free_starts])
    sizes = np.concatenate([sizes, free_sizes])
    order = np.argsort(starts, kind="stable")
    ends = np.cumsum(sizes[order])
    if not (np.array_equal(starts[order], np.concatenate([[0], ends[:-1]])) and ends[-1] == placer.capacity_slots):
        raise AssertionError(f"{space} extents and free space overlap or leave a gap")
    if int(free_sizes.sum()) != placer.free_slots:
        raise AssertionError(f"{space} free-slot counter differs from a recount")
    placer.check()
