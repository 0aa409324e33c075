"""Physical pages behind virtual extents (vAttention, Prabhu et al., ASPLOS '25): geometry and the page pool.

KV memory is one buffer per layer for K and one for V (`2 × num_layers` buffers). A request's virtual
extent spans the same token range in every buffer, and a physical page of `page_bytes` is mapped into
each buffer when a token first lands in that range, so the pages of all buffers move in lockstep: the
unit here, a *page*, is `page_tokens` tokens backed by one driver page in each of the buffers.
`page_tokens = page_bytes // (kv_heads × head_dim × dtype_bytes)` (2 MiB holds 1,024 tokens of
Llama-3-8B in fp16, 64 KiB holds 32); a page's remainder smaller than one token row is unusable and is
not counted in the pool, like a pool's tail smaller than a block.

`PagePool` owns the page counts only (which physical page backs which virtual page is the driver's
business, `workbench.engine.kvpool_vmm`): free pages, and with the reuse cache on, pages that stay mapped in a
released extent (vAttention keeps a finished request's pages mapped for the next request that gets
the same extent, saving the mapping calls); those are evictable and reclaimed, last extent first,
when free pages run out. It also logs every unmapping (a release without reuse, a reclaim), which the
step plan carries to the KV pool so that the pool's mapped pages follow the strategy's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.allocators.virtual import loops
from workbench.presets import ModelPreset, dtype_bytes, model_from_name

DEFAULT_GEOMETRY_MODEL = "opt-13b"  # the run configuration's default model, for strategies built without one


@dataclass(frozen=True, slots=True)
class KVGeometry:
    """The per-token shape of KV memory that sizes pages in tokens."""

    num_layers: int
    buffer_bytes_per_token: int  # one token's row in one layer's K (or V) buffer: kv_heads × head_dim × dtype

    @classmethod
    def of(cls, model: str | ModelPreset, kv_dtype: str) -> KVGeometry:
        """The geometry of a model preset (or its name) with this KV dtype."""
        model = model_from_name(model) if isinstance(model, str) else model
        return cls(model.num_layers, model.num_kv_heads * model.head_dim * dtype_bytes(kv_dtype))

    @property
    def num_buffers(self) -> int:
        """Layer K/V buffers, each with its own mapping of every page."""
        return 2 * self.num_layers

    def page_tokens(self, page_kib: int) -> int:
        tokens = page_kib * 1024 // self.buffer_bytes_per_token
        if tokens < 1:
            raise ValueError(f"a page of {page_kib} KiB holds no token row of {self.buffer_bytes_per_token} bytes")
        return tokens

    def num_pages(self, capacity_slots: int, page_kib: int) -> int:
        """Physical pages per buffer in the memory of `capacity_slots` token slots."""
        return capacity_slots * self.buffer_bytes_per_token // (page_kib * 1024)


class PagePool:
    """Physical page counts per virtual extent. Every method but the queries mutates.

    A held extent *uses* the pages its sequence's tokens occupy (`used`, pages 0..used-1) and may map
    more (`mapped` >= `used`): pages kept from the extent's previous owner (reuse cache). Those,
    and every page of a released extent, are *cached*: mapped, holding nothing, evictable. The counts and the
    verbs that change them are `virtual.loops`' (compiled), which a compiled step loop calls on these arrays too."""

    def __init__(self, num_pages: int, num_extents: int, reuse: bool) -> None:
        self.num_pages = num_pages
        self.reuse = reuse
        self.counts = np.zeros(loops.NUM_COUNTS, dtype=np.int64)  # free, cached, ever mapped (`loops.FREE` ..)
        self.counts[loops.FREE] = num_pages
        self.mapped = np.zeros(num_extents, dtype=np.int64)  # [num_extents] pages mapped into each extent
        self.used = np.zeros(num_extents, dtype=np.int64)  # [num_extents] pages its sequence's tokens occupy
        self.held = np.zeros(num_extents, dtype=bool)  # [num_extents] extent owned by a sequence
        self.unmapped: list[tuple[int, int, int]] = []  # (extent, first page, pages) unmapped since the last drain
        self._one_log = self._log(1)  # scratch of a decode step's opening or a release (every step: not allocated)

    @property
    def free_pages(self) -> int:
        """Pages unmapped."""
        return int(self.counts[loops.FREE])

    @property
    def cached_pages(self) -> int:
        """Pages mapped and unused: the sum of (mapped - used)."""
        return int(self.counts[loops.CACHED])

    @property
    def mapped_total(self) -> int:
        """Pages ever mapped (a reused page is not mapped again)."""
        return int(self.counts[loops.MAPPED_TOTAL])

    def available(self) -> int:
        """Pages a sequence can still get: free plus reclaimable cached ones."""
        return int(loops.available(self.counts))

    def pick(self, count: int) -> list[int] | None:
        """Pure. The extents `take` would hand out for `count` sequences, in order: released extents
        with the most mapped pages first, lowest index among equals; None when too few are free."""
        picked = np.empty(count, dtype=np.int64)
        return picked.tolist() if loops.pick_extents(self.held, self.mapped, picked) == count else None

    def can_take(self, extents: list[int], pages_needed: list[int]) -> bool:
        """Pure. Whether `take(extents, pages_needed)` would succeed."""
        return bool(loops.can_take(self.counts, self.mapped, np.array(extents, dtype=np.int64),
                                   np.array(pages_needed, dtype=np.int64)))

    def take(self, extents: list[int], pages_needed: list[int]) -> None:
        """Sequences get these distinct released extents, each using `pages_needed` pages: first the
        extent's own mapped pages, then new mappings (reclaiming other cached pages if free ones run
        out). Raises RuntimeError, changing nothing, when `can_take` is False."""
        if not self.can_take(extents, pages_needed):
            raise RuntimeError(f"out of pages for extents {extents}")
        log = self._log(len(extents))
        n = loops.take(self.counts, self.mapped, self.used, self.held, np.array(extents, dtype=np.int64),
                       np.array(pages_needed, dtype=np.int64), log, 0)
        self._logged(log, n)

    def can_grow(self, extents: np.ndarray) -> bool:
        """Pure. Whether `grow(extents)` would succeed."""
        return self.can_grow_by(extents, np.ones(extents.shape[0], dtype=np.int64))

    def can_grow_by(self, extents: np.ndarray, pages: np.ndarray) -> bool:
        """Pure. Whether these distinct held extents (int64 [k]) can each use `pages[i]` more pages: its own
        mapped, unused pages first, then new mappings (reclaiming other cached pages)."""
        reused = int(np.minimum(pages, self.mapped[extents] - self.used[extents]).sum())
        return self.can_open(int(pages.sum()), reused)

    def can_open(self, pages: int, reused: int) -> bool:
        """Pure. Whether held extents can use `pages` more pages, `reused` of them mapped in them already: the
        others are new mappings, of free pages or reclaimed cached ones other than those."""
        return bool(loops.can_open(self.counts, pages, reused))

    def grow(self, extents: np.ndarray) -> None:
        """One more used page in each of these distinct held extents, int64 [k]: the next mapped one
        if the extent has it, else a new mapping. Raises RuntimeError, changing nothing, when out of pages."""
        if not self.can_grow(extents):
            raise RuntimeError(f"out of pages: {extents.shape[0]} needed, {self.available()} can be mapped")
        to_map = np.empty(extents.shape[0], dtype=np.int64)
        n = loops.open_pages(extents, self.mapped, self.used, to_map)
        self.opened(extents.shape[0] - n, to_map[:n])

    def opened(self, reused: int, to_map: np.ndarray) -> None:
        """Held extents used more pages (`loops.open_page`): `reused` of their own mapped pages, and one new
        mapping for each extent of `to_map`."""
        log = self._one_log
        self._logged(log, loops.opened(self.counts, self.mapped, self.used, reused, to_map, log, 0))

    def release(self, extent: int) -> None:
        """The extent's sequence is gone: its pages stay mapped as cache (reuse on) or are unmapped."""
        log = self._one_log
        self._logged(log, loops.release(self.counts, self.mapped, self.used, self.held, extent, self.reuse, log, 0))

    def shrink(self, extent: int, used: int) -> None:
        """The extent's sequence gave back its tail (speculative decoding's rejected drafts) and uses `used`
        pages: the pages past them stay mapped as cache (reuse on) or are unmapped."""
        drop = int(self.used[extent]) - used
        if drop <= 0:
            return
        self.used[extent] = used
        if self.reuse:
            self.counts[loops.CACHED] += drop
            return
        self.mapped[extent] -= drop
        self.counts[loops.FREE] += drop
        self.unmapped.append((extent, int(self.mapped[extent]), drop))

    def drain_unmapped(self) -> list[tuple[int, int, int]]:
        """(extent, first page, pages) of every unmapping since the last drain, in order; forgets them."""
        unmapped, self.unmapped = self.unmapped, []
        return unmapped

    def _log(self, reclaims: int) -> np.ndarray:
        """An unmapping log (`loops`) with room for `reclaims` reclaims (one row per extent each) and a release."""
        return np.empty((reclaims * self.mapped.shape[0] + 1, 3), dtype=np.int64)

    def _logged(self, log: np.ndarray, n: int) -> None:
        if n:
            self.unmapped += [tuple(row) for row in log[:n].tolist()]

    def check(self) -> None:
        if self.free_pages < 0 or np.any(self.used < 0) or np.any(self.mapped < self.used):
            raise AssertionError("negative page count, or an extent uses more pages than it maps")
        if np.any(self.used[~self.held]):
            raise AssertionError("a released extent uses pages")
        if int(self.mapped.sum()) + self.free_pages != self.num_pages:
            raise AssertionError("mapped + free pages differ from the pool's pages")
        if int((self.mapped - self.used).sum()) != self.cached_pages:
            raise AssertionError("cached-page counter differs from the mapped, unused pages")
        if not self.reuse and self.cached_pages:
            raise AssertionError("pages cached with the reuse cache off")
