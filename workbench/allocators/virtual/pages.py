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
    and every page of a released extent, are *cached*: mapped, holding nothing, evictable."""

    def __init__(self, num_pages: int, num_extents: int, reuse: bool) -> None:
        self.num_pages = num_pages
        self.reuse = reuse
        self.free_pages = num_pages  # unmapped
        self.cached_pages = 0  # mapped and unused: sum of (mapped - used)
        self.mapped_total = 0  # pages ever mapped (a reused page is not mapped again)
        self.mapped = np.zeros(num_extents, dtype=np.int64)  # [num_extents] pages mapped into each extent
        self.used = np.zeros(num_extents, dtype=np.int64)  # [num_extents] pages its sequence's tokens occupy
        self.held = np.zeros(num_extents, dtype=bool)  # [num_extents] extent owned by a sequence
        self.unmapped: list[tuple[int, int, int]] = []  # (extent, first page, pages) unmapped since the last drain

    def available(self) -> int:
        """Pages a sequence can still get: free plus reclaimable cached ones."""
        return self.free_pages + self.cached_pages

    def pick(self, count: int) -> list[int] | None:
        """Pure. The extents `take` would hand out for `count` sequences, in order: released extents
        with the most mapped pages first, lowest index among equals; None when too few are free."""
        picked = np.empty(count, dtype=np.int64)
        return picked.tolist() if loops.pick_extents(self.held, self.mapped, picked) == count else None

    def can_take(self, extents: list[int], pages_needed: list[int]) -> bool:
        """Pure. Whether `take(extents, pages_needed)` would succeed."""
        reused = [min(n, int(self.mapped[e])) for e, n in zip(extents, pages_needed, strict=True)]
        return sum(pages_needed) - sum(reused) <= self.available() - sum(reused)

    def take(self, extents: list[int], pages_needed: list[int]) -> None:
        """Sequences get these distinct released extents, each using `pages_needed` pages: first the
        extent's own mapped pages, then new mappings (reclaiming other cached pages if free ones run
        out). Raises RuntimeError, changing nothing, when `can_take` is False."""
        if not self.can_take(extents, pages_needed):
            raise RuntimeError(f"out of pages for extents {extents}")
        for extent, needed in zip(extents, pages_needed, strict=True):
            reused = min(needed, int(self.mapped[extent]))
            self.held[extent] = True
            self.used[extent] = reused
            self.cached_pages -= reused
        for extent, needed in zip(extents, pages_needed, strict=True):
            new = needed - int(self.used[extent])
            self._count_mappings(new)
            self.mapped[extent] += new
            self.used[extent] = needed

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
        return pages - reused <= self.available() - reused

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
        self.cached_pages -= reused
        self._map(to_map)

    def release(self, extent: int) -> None:
        """The extent's sequence is gone: its pages stay mapped as cache (reuse on) or are unmapped."""
        self.held[extent] = False
        if self.reuse:
            self.cached_pages += int(self.used[extent])
        else:
            self.cached_pages -= int(self.mapped[extent] - self.used[extent])
            self.free_pages += int(self.mapped[extent])
            if self.mapped[extent]:
                self.unmapped.append((extent, 0, int(self.mapped[extent])))
            self.mapped[extent] = 0
        self.used[extent] = 0

    def shrink(self, extent: int, used: int) -> None:
        """The extent's sequence gave back its tail (speculative decoding's rejected drafts) and uses `used`
        pages: the pages past them stay mapped as cache (reuse on) or are unmapped."""
        drop = int(self.used[extent]) - used
        if drop <= 0:
            return
        self.used[extent] = used
        if self.reuse:
            self.cached_pages += drop
            return
        self.mapped[extent] -= drop
        self.free_pages += drop
        self.unmapped.append((extent, int(self.mapped[extent]), drop))

    def drain_unmapped(self) -> list[tuple[int, int, int]]:
        """(extent, first page, pages) of every unmapping since the last drain, in order; forgets them."""
        unmapped, self.unmapped = self.unmapped, []
        return unmapped

    def _map(self, extents: np.ndarray) -> None:
        """Map one page into the end of each of these extents, int64 [k] (repeats allowed). The caller
        checked the availability and counts the new pages as used: they are not cached."""
        self._count_mappings(extents.shape[0])
        np.add.at(self.mapped, extents, 1)

    def _count_mappings(self, count: int) -> None:
        """`count` pages are about to be mapped (the caller adds them to `mapped`): free ones, reclaiming cached
        ones first where too few are free."""
        self._reclaim(count - self.free_pages)
        self.free_pages -= count
        self.mapped_total += count

    def _reclaim(self, count: int) -> None:
        """Unmap `count` cached pages, from the tails of the highest-numbered extents first."""
        if count <= 0:
            return
        for extent in np.flatnonzero(self.mapped > self.used)[::-1].tolist():
            if count <= 0:
                return
            drop = min(count, int(self.mapped[extent] - self.used[extent]))
            self.mapped[extent] -= drop
            self.unmapped.append((extent, int(self.mapped[extent]), drop))
            self.cached_pages -= drop
            self.free_pages += drop
            count -= drop

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
