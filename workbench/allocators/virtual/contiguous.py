"""`virtual-contiguous`: vAttention — a virtual extent per request, physical pages mapped on demand.

Every admitted sequence owns one of `max_batch` virtual extents of `max_model_len` tokens (rounded up
to whole pages), pre-reserved like vAttention's per-request sub-tensors: virtual space costs nothing,
but there are only `max_batch` extents, so a request waits when all are taken. The kernel sees a plain
contiguous extent (`kv_start` = the extent's first slot in the virtual slot space of
`virtual_slots = max_batch × extent_slots`), with no block table. Physical memory is committed a page
at a time (`workbench.allocators.virtual.pages`) when a token first lands in a page and returned when
the sequence ends, or kept mapped in the released extent with the reuse cache on.

Accounting in physical slots (C = pages × page_tokens):
- token = tokens written; reserved = unwritten slots of the pages its tokens occupy that the sequence
  will still fill; internal = the tail of its last page past its final length (the page's slack);
- cached = mapped pages holding no token: with the reuse cache, a released extent's pages and the
  pages an extent kept from its previous owner beyond its own tokens (evictable, like a prefix
  cache's blocks: reused without a mapping call, or unmapped when free pages run out);
- external = 0 (physical pages need no adjacency); free = the rest.
A virtual extent belongs to one sequence, so nothing is shared: samples 2..n get the prompt as copies
from the first extent and a fork copies the parent's written slots (slot pairs, block size 1), each
into pages of its own. Swap moves the written slots to a first-fit host space and releases the extent.
`block_table_bytes` is the driver's page tables: one 8-byte PTE per mapped page in each layer's K and
V buffer (NVIDIA's Pascal-and-later GMMU format), plus the 8-byte (kv_start, kv_len) descriptor per
sequence that the kernel reads.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.base import Strategy
from workbench.allocators.batch_check import check_batch, raise_for_status
from workbench.allocators.contiguous.extents import RunPlacer
from workbench.allocators.contiguous.strategy import _copy_pairs, _fits, _place_all
from workbench.allocators.seq_rows import SeqRows
from workbench.allocators.values import (
    AdmitResult,
    AppendResult,
    ContiguousDescriptor,
    SeqSpec,
    Snapshot,
    StepEffects,
    SwapResult,
)
from workbench.allocators.virtual import loops
from workbench.allocators.virtual.compiled_pool import CompiledExtentPool
from workbench.allocators.virtual.pages import DEFAULT_GEOMETRY_MODEL, KVGeometry, PagePool
from workbench.intmath import cdiv
from workbench.presets import vmm_map_us_per_page

_NO_COPIES = np.zeros((0, 2), dtype=np.int32)


class VirtualContiguous(Strategy):
    name = "virtual-contiguous"
    kernel_mode = "contiguous"
    block_size = 1  # copy and swap pairs are slot pairs, as for contiguous strategies
    supports_swap = True
    wants_token_ids = False
    needs_prompt_ids = False

    def __init__(self, *, capacity_slots: int, max_model_len: int, block_size: int = 1, swap_slots: int = 0,
                 page_kib: int = 2048, max_batch: int = 256, page_reuse: str = "off",
                 map_us_per_page: float | None = None,
                 overlap_map: str = "off", geometry: KVGeometry | None = None) -> None:
        del block_size  # the page size comes from page_kib and the geometry
        if map_us_per_page is None:  # vAttention's measurement for this page size (workbench.presets)
            map_us_per_page = vmm_map_us_per_page(page_kib)
        if max_model_len < 1 or max_batch < 1 or swap_slots < 0 or map_us_per_page < 0:
            raise ValueError(f"need max_model_len ({max_model_len}) >= 1, max_batch ({max_batch}) >= 1, "
                             f"swap_slots ({swap_slots}) >= 0, map_us_per_page ({map_us_per_page}) >= 0")
        self.geometry = geometry or KVGeometry.of(DEFAULT_GEOMETRY_MODEL, "fp16")
        self.page_kib = page_kib
        self.page_tokens = self.geometry.page_tokens(page_kib)
        num_pages = self.geometry.num_pages(capacity_slots, page_kib)
        if num_pages < 1:
            raise ValueError(f"{capacity_slots} slots hold no whole page of {page_kib} KiB")
        self.capacity_slots = num_pages * self.page_tokens
        self.max_model_len = max_model_len
        self.max_batch = max_batch
        self.extent_slots = cdiv(max_model_len, self.page_tokens) * self.page_tokens
        self._virtual_slots = max_batch * self.extent_slots
        if self._virtual_slots > np.iinfo(np.int32).max:  # kv_start is int32 at the kernel boundary
            raise ValueError(f"max_batch {max_batch} × {self.extent_slots} slots exceeds the int32 slot space")
        # the modeled cost of mapping one page into every layer's K and V buffer, and whether it
        # overlaps the step's compute (vAttention's background mapping); read by the engine's clock
        self.map_s_per_page = map_us_per_page * 1e-6 * self.geometry.num_buffers
        self._mapped_reported = 0  # pages mapped up to the last end_step
        self.overlap_map = overlap_map == "on"
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        self.prefix_evicted_blocks = 0  # no prefix cache: reused pages are not prefix blocks
        self._pages = PagePool(num_pages, max_batch, reuse=page_reuse == "on")
        self._host = RunPlacer(swap_slots, best=False) if swap_slots else None
        # on-device sequences, each row holding its extent: a decode batch's extents are one cached lookup of its
        # rows (`SeqRows.rows`) and one gather, not a dictionary read per sequence
        self._seqs = SeqRows(("extent",))
        self._swapped: dict[int, tuple[int, int, int]] = {}  # sequence -> (host_start, length, final_len)
        self._length = np.zeros(max_batch, dtype=np.int64)  # [max_batch] tokens written, per extent
        self._final = np.zeros(max_batch, dtype=np.int64)  # [max_batch] final length, per extent
        self._not_swapped = np.zeros(max_batch, dtype=np.int64)  # a held extent's sequence is on the device
        self._mark = np.zeros(max_batch, dtype=np.int64)  # check_batch's scratch, all zero between calls

    def compiled_pool(self) -> CompiledExtentPool | None:
        """Without a host pool and holding no sequence (the compiled loop's case: no swap, recompute preemption)."""
        plain = type(self) is VirtualContiguous and self._host is None and not len(self._seqs)
        return CompiledExtentPool(self) if plain else None

    @property
    def virtual_slots(self) -> int:
        """Slots the kernel addresses: `max_batch` extents of `extent_slots`, mapped page by page."""
        return self._virtual_slots

    def end_step(self) -> StepEffects:
        """Mutates: the pages mapped since the last call and the slot ranges unmapped since then."""
        mapped, self._mapped_reported = self.mapped_pages - self._mapped_reported, self.mapped_pages
        return StepEffects(mapped_pages=mapped, unmapped=self.drain_unmapped())

    @property
    def mapped_pages(self) -> int:
        """Pages mapped since the start (each into all layer K/V buffers), for the step cost."""
        return self._pages.mapped_total

    def drain_unmapped(self) -> np.ndarray:
        """Mutates (forgets what it returns). int64 [k, 2]: the virtual slot ranges [start, stop) whose
        pages were unmapped since the last call, in order, for the step plan to release in the KV pool."""
        p = self.page_tokens
        ranges = [(e * self.extent_slots + first * p, e * self.extent_slots + (first + n) * p)
                  for e, first, n in self._pages.drain_unmapped()]
        return np.array(ranges, dtype=np.int64).reshape(-1, 2)

    def mapped_virtual_pages(self) -> np.ndarray:
        """Pure. int64 [m], ascending: the virtual pages (slot // page_tokens) backed by physical memory."""
        mapped = self._pages.mapped
        extents = np.repeat(np.arange(mapped.shape[0], dtype=np.int64), mapped)
        first = np.repeat(np.cumsum(mapped) - mapped, mapped)
        return extents * (self.extent_slots // self.page_tokens) + np.arange(extents.shape[0]) - first

    # ---- admission and growth ----------------------------------------------------------------
    def admit(self, seq_ids: list[int], spec: SeqSpec) -> AdmitResult:
        """Mutates on success: one extent per sequence and pages for the prompt, all or nothing."""
        if not seq_ids or len(set(seq_ids)) != len(seq_ids) or any(self._known(s) for s in seq_ids):
            raise ValueError(f"sequence ids {seq_ids} are empty, repeat or are already live")
        if not 1 <= spec.num_tokens <= spec.final_len <= self.max_model_len:
            raise ValueError(f"need 1 <= num_tokens ({spec.num_tokens}) <= final_len ({spec.final_len}) "
                             f"<= max_model_len ({self.max_model_len})")
        held = spec.num_held(0)  # no prefix cache: the first chunk under chunked prefill, else the prompt
        extents, reason = self._place([held] * len(seq_ids), [spec.final_len] * len(seq_ids))
        if extents is None:
            return AdmitResult(False, reason=reason)
        for seq_id, extent in zip(seq_ids, extents, strict=True):
            self._hold(seq_id, extent)
        first = self._base(extents[0])
        copies = [_copy_pairs(first, self._base(e), held) for e in extents[1:]]
        return AdmitResult(True, copies=np.concatenate(copies) if copies else None)

    def extend(self, seq_ids: list[int], token_ids: np.ndarray) -> AdmitResult:
        """Mutates on success. The group's next prompt chunk of `token_ids.shape[0]` tokens, mapping the
        pages it opens in every extent, all or nothing; copies deliver it from the first extent to the
        others', as admission does."""
        extents = self._group_extents(seq_ids)
        length, k = int(self._length[extents[0]]), int(token_ids.shape[0])
        if not np.all(self._length[extents] == length):
            raise ValueError(f"sequences {seq_ids} hold different lengths: not one group being prefilled")
        if length + k > int(self._final[extents].min()):
            raise ValueError(f"extending {seq_ids} by {k} tokens passes their final length")
        pool = self._pages
        new_pages = cdiv(length + k, self.page_tokens) - int(pool.used[extents[0]])
        reused = int(np.minimum(pool.mapped[extents] - pool.used[extents], new_pages).sum())
        if extents.shape[0] * new_pages - reused > pool.available() - reused:
            return AdmitResult(False, reason=f"needs {new_pages} more pages per sequence")
        for _ in range(new_pages):  # checked above: every page can be had
            pool.grow(extents)
        self._length[extents] += k
        first = self._base(extents[0]) + length
        copies = [_copy_pairs(first, self._base(e) + length, k) for e in extents[1:]]
        return AdmitResult(True, copies=np.concatenate(copies) if copies else None)

    def fork(self, parent_id: int, child_id: int) -> AdmitResult:
        """Mutates on success: an extent and pages for the child, and copies of the parent's slots."""
        if self._known(child_id):
            raise ValueError(f"sequence {child_id} is already live")
        parent = self._device_extent(parent_id)
        length, final_len = int(self._length[parent]), int(self._final[parent])
        extents, reason = self._place([length], [final_len])
        if extents is None:
            return AdmitResult(False, reason=reason)
        self._hold(child_id, extents[0])
        return AdmitResult(True, copies=_copy_pairs(self._base(parent), self._base(extents[0]), length))

    def can_append(self, seq_ids: list[int]) -> bool:
        extents = self._batch_extents(seq_ids)
        return self._pages.can_open(*self._openings(extents))

    def append(self, seq_ids: list[int], token_ids: np.ndarray | None = None) -> AppendResult:
        """Mutates. The next slot of each extent, mapping a page where a token opens one; raises
        RuntimeError, changing nothing, when the pages run out. `token_ids` is ignored."""
        appended = self.append_if_room(seq_ids, token_ids)
        if appended is None:
            raise RuntimeError(f"out of pages: {self._pages.available()} can be mapped, fewer than the batch opens")
        return appended

    def append_if_room(self, seq_ids: list[int], token_ids: np.ndarray | None = None) -> AppendResult | None:
        """`append` when the pages can be had, else None (nothing changed); the batch's extents found once."""
        del token_ids
        extents = self._batch_extents(seq_ids)
        opening, reused = self._openings(extents)
        return self._append_counted(extents, reused) if self._pages.can_open(opening, reused) else None

    def _openings(self, extents: np.ndarray) -> tuple[int, int]:
        """Pure. (pages the batch's next tokens open, of which its extents map already)."""
        pool = self._pages
        return loops.openings(extents, self._length, pool.mapped, pool.used, self.page_tokens)

    def _append_counted(self, extents: np.ndarray, reused: int) -> AppendResult:
        """Mutates. `append` of the batch's `extents`, whose openings (`reused` of them onto pages mapped
        already) the pool can supply."""
        pool = self._pages
        slots = np.empty(extents.shape[0], dtype=np.int64)
        to_map = np.empty(extents.shape[0], dtype=np.int64)
        n = loops.apply_append(extents, self._length, pool.mapped, pool.used, self.page_tokens, self.extent_slots,
                               slots, to_map)
        pool.opened(reused, to_map[:n])
        return AppendResult(slots=slots, copies=_NO_COPIES)

    supports_drafts = True

    def append_with_drafts(self, seq_ids: list[int], token_ids: np.ndarray | None,
                           num_drafts: np.ndarray) -> AppendResult | None:
        """`Strategy.append_with_drafts`, counted before anything changes: the pages each extent opens for its
        last token and drafts; the rounds then cannot fail (a failed round given back would leave pages mapped
        or reclaimed: the pool changed)."""
        extents = self._batch_extents(seq_ids)
        opened = cdiv(self._length[extents] + 1 + num_drafts, self.page_tokens) - self._pages.used[extents]
        if not self._pages.can_grow_by(extents, opened):
            return None
        return super().append_with_drafts(seq_ids, token_ids, num_drafts)

    def _drop_tail(self, seq_ids: list[int], num_slots: np.ndarray) -> None:
        """Mutates. The lengths shrink; pages no longer used stay mapped as cache (page reuse on) or are
        unmapped, as a finished sequence's are."""
        extents = self._group_extents(seq_ids)
        self._length[extents] -= num_slots
        for extent in extents[num_slots > 0].tolist():
            self._pages.shrink(extent, cdiv(int(self._length[extent]), self.page_tokens))

    def free(self, seq_id: int) -> None:
        """Mutates. The extent is released; its pages are unmapped or, with reuse, stay mapped."""
        if seq_id in self._swapped:
            host_start, length, _ = self._swapped.pop(seq_id)
            self._host.release(host_start, length)
            return
        self._pages.release(self._device_extent(seq_id))
        self._seqs.remove(seq_id)

    # ---- kernel view ---------------------------------------------------------------------------
    def slot_mapping(self, seq_id: int, start: int, stop: int) -> np.ndarray:
        extent = self._device_extent(seq_id)
        if not 0 <= start <= stop <= self._length[extent]:
            raise ValueError(f"positions [{start}, {stop}) outside sequence {seq_id} of {self._length[extent]} tokens")
        return self._base(extent) + np.arange(start, stop, dtype=np.int64)

    def describe(self, seq_ids: list[int]) -> ContiguousDescriptor:
        extents = self._extents_of(seq_ids)
        return ContiguousDescriptor(kv_start=(extents * self.extent_slots).astype(np.int32),
                                    kv_len=self._length[extents].astype(np.int32))

    # ---- accounting ----------------------------------------------------------------------------
    def num_allocatable_blocks(self) -> int:
        """Slots of the pages a request can get now: free plus reclaimable cached ones. Pure."""
        return self._pages.available() * self.page_tokens

    def snapshot(self, refused_extent_slots: int = 0) -> Snapshot:
        """Pure. O(max_batch). External fragmentation is always 0."""
        del refused_extent_slots
        pool, p = self._pages, self.page_tokens
        token, reserved, internal = loops.held_totals(pool.held, pool.used, self._length, self._final, p)
        cached = pool.cached_pages * p
        table_bytes = loops.page_table_bytes(pool.num_pages, pool.free_pages, self.geometry.num_buffers,
                                             len(self._seqs))
        return Snapshot(
            capacity_slots=self.capacity_slots, token_slots=token, reserved_slots=reserved,
            internal_frag_slots=internal, cached_slots=cached, external_frag_slots=0,
            free_slots=pool.free_pages * p, logical_token_slots=token, block_table_bytes=int(table_bytes),
            largest_free_extent_slots=pool.free_pages * p, num_free_blocks=self.num_allocatable_blocks())

    # ---- swapping ------------------------------------------------------------------------------
    def can_swap_out(self, seq_ids: list[int]) -> bool:
        extents = self._group_extents(seq_ids)
        return self._host is not None and _fits(self._host, self._length[extents].tolist())

    def swap_out(self, seq_ids: list[int]) -> SwapResult:
        """Mutates. Each sequence's written slots move to a host extent; its device extent is released."""
        extents = self._group_extents(seq_ids).tolist()
        lengths = [int(self._length[e]) for e in extents]
        hosts = _place_all(self._host, lengths) if self._host is not None else None
        if hosts is None:
            raise RuntimeError(f"cannot swap out {seq_ids}: no host extents for {lengths} slots")
        moves = []
        for seq_id, extent, (host_start, length) in zip(seq_ids, extents, hosts, strict=True):
            moves.append(_copy_pairs(self._base(extent), host_start, length))
            self._swapped[seq_id] = (host_start, length, int(self._final[extent]))
            self._pages.release(extent)
            self._seqs.remove(seq_id)
        return SwapResult(moves=np.concatenate(moves))

    def can_swap_in(self, seq_ids: list[int]) -> bool:
        lengths, _ = self._swapped_group(seq_ids)
        return self._choose(lengths)[0] is not None

    def swap_in(self, seq_ids: list[int]) -> SwapResult:
        """Mutates. Each sequence gets an extent and pages again, and its written slots back."""
        lengths, finals = self._swapped_group(seq_ids)
        extents, reason = self._place(lengths, finals)
        if extents is None:
            raise RuntimeError(f"cannot swap in {seq_ids}: {reason}")
        moves = []
        for seq_id, extent in zip(seq_ids, extents, strict=True):
            host_start, length, _ = self._swapped.pop(seq_id)
            moves.append(_copy_pairs(host_start, self._base(extent), length))
            self._host.release(host_start, length)
            self._hold(seq_id, extent)
        return SwapResult(moves=np.concatenate(moves))

    def check_integrity(self) -> None:
        """Pure. Page counters match a recount; every held extent has exactly one sequence, with
        1 <= length <= final_len <= max_model_len and the pages its length needs, never past its final one."""
        pool, p = self._pages, self.page_tokens
        pool.check()
        extents = np.sort(self._seqs.column("extent")[self._seqs.live])
        if np.unique(extents).shape[0] != extents.shape[0] or not np.array_equal(np.flatnonzero(pool.held), extents):
            raise AssertionError("held extents differ from the sequences' extents")
        length, final = self._length[extents], self._final[extents]
        if not (np.all(length >= 1) and np.all(length <= final) and np.all(final <= self.max_model_len)):
            raise AssertionError("1 <= length <= final_len <= max_model_len broken")
        if not np.array_equal(pool.used[extents], cdiv(length, p)):
            raise AssertionError("an extent's used pages differ from the pages its tokens occupy")
        if self._host is not None:
            held = sum(length for _, length, _ in self._swapped.values())
            if held + self._host.free_slots != self._host.capacity_slots:
                raise AssertionError("host slots of swapped sequences and free host space differ from the host pool")
            self._host.check()

    # ---- internals -----------------------------------------------------------------------------
    def _choose(self, lengths: list[int]) -> tuple[list[int] | None, str]:
        """Pure. Extents for sequences of these lengths, or None and why not."""
        if len(lengths) > self.max_batch:
            return None, (f"its {len(lengths)} sequences need {len(lengths)} virtual extents, more than --max-batch "
                          f"{self.max_batch}")
        extents = self._pages.pick(len(lengths))
        if extents is None:
            return None, loops.extents_refused(self.max_batch - len(self._seqs), len(lengths), self.max_batch)
        needed = [cdiv(n, self.page_tokens) for n in lengths]
        if not self._pages.can_take(extents, needed):
            return None, loops.pages_refused(sum(needed), self.page_tokens, self._pages.available())
        return extents, ""

    def _place(self, lengths: list[int], finals: list[int]) -> tuple[list[int] | None, str]:
        """Mutates on success: extents holding the pages of these lengths, filled to them."""
        extents, reason = self._choose(lengths)
        if extents is None:
            return None, reason
        self._pages.take(extents, [cdiv(n, self.page_tokens) for n in lengths])
        self._length[extents] = lengths
        self._final[extents] = finals
        return extents, ""

    def _extents_of(self, seq_ids: list[int]) -> np.ndarray:
        """int64 [k]: the extents of on-device sequences; ValueError for a sequence that is not."""
        try:
            rows = self._seqs.rows(seq_ids)
        except KeyError:  # which one, and why
            return np.array([self._device_extent(s) for s in seq_ids], dtype=np.int64)
        return self._seqs.column("extent")[rows]

    def _group_extents(self, seq_ids: list[int]) -> np.ndarray:
        """int64 [k]: the extents of distinct on-device sequences (each holds its own); ValueError otherwise."""
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"a sequence id repeats in {seq_ids}")
        return self._extents_of(seq_ids)

    def _batch_extents(self, seq_ids: list[int]) -> np.ndarray:
        """int64 [k]: the extents of a decode batch: distinct on-device sequences short of their final length
        (the check every strategy's decode append makes, `batch_check`)."""
        extents = self._extents_of(seq_ids)
        status, bad = check_batch(extents, self._length, self._final, self._not_swapped, self._mark)
        if status != 0:
            raise_for_status(status, seq_ids, bad)
        return extents

    def _swapped_group(self, seq_ids: list[int]) -> tuple[list[int], list[int]]:
        if len(set(seq_ids)) != len(seq_ids) or not all(s in self._swapped for s in seq_ids):
            raise ValueError(f"every sequence of {seq_ids} must be swapped out, once")
        return [self._swapped[s][1] for s in seq_ids], [self._swapped[s][2] for s in seq_ids]

    def _device_extent(self, seq_id: int) -> int:
        if seq_id not in self._seqs:
            state = "swapped out" if seq_id in self._swapped else "not live"
            raise ValueError(f"sequence {seq_id} is {state}")
        return int(self._seqs.column("extent")[self._seqs.row(seq_id)])

    def _hold(self, seq_id: int, extent: int) -> None:
        """Mutates. The sequence (not live) is on the device in `extent`."""
        row = self._seqs.add(seq_id)
        self._seqs.column("extent")[row] = extent  # after `add`: a grown table replaces the column

    def _known(self, seq_id: int) -> bool:
        return seq_id in self._seqs or seq_id in self._swapped

    def _base(self, extent: int) -> int:
        return extent * self.extent_slots

