"""The per-step loops of `virtual-contiguous`, compiled with Numba (see `paged.loops` for why).

Arrays (the strategy's and its page pool's, `virtual.contiguous`, `virtual.pages`): `extents` int64 [k]
distinct held extents; `length`, `final` int64 [max_batch] tokens written and final length per extent;
`mapped`, `used` int64 [max_batch] pages mapped into each extent and pages its tokens occupy; `held` bool
[max_batch] extent owned by a sequence.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def opens_page(extent, length, used, page_tokens):
    """Pure. Whether the extent's next token opens a page: the pages its tokens use are full."""
    return length[extent] == used[extent] * page_tokens


@njit(cache=True)
def open_page(extent, mapped, used):
    """Extent `extent` uses one more page: its next mapped one when it has one (False), else a page to be
    mapped (True)."""
    fresh = mapped[extent] == used[extent]
    used[extent] += 1
    return fresh


@njit(cache=True)
def open_pages(extents, mapped, used, to_map):
    """`open_page` for each extent, in order; fills `to_map` (int64 [>= k]) with those that need a new
    mapping and returns how many."""
    n = 0
    for i in range(extents.shape[0]):
        if open_page(extents[i], mapped, used):
            to_map[n] = extents[i]
            n += 1
    return n


@njit(cache=True)
def openings(extents, length, mapped, used, page_tokens):
    """Pure. (pages a decode append opens: extents whose used pages are full; of which they map already)."""
    opening = reused = 0
    for i in range(extents.shape[0]):
        e = extents[i]
        if opens_page(e, length, used, page_tokens):
            opening += 1
            reused += mapped[e] > used[e]
    return opening, reused


@njit(cache=True)
def apply_append(extents, length, mapped, used, page_tokens, extent_slots, slots, to_map):
    """Each extent's next slot (into `slots` int64 [k]), opening a page where its used pages are full
    (`open_page`; those to be mapped into `to_map` int64 [>= k]). Returns how many are to be mapped."""
    n = 0
    for i in range(extents.shape[0]):
        e = extents[i]
        if opens_page(e, length, used, page_tokens) and open_page(e, mapped, used):
            to_map[n] = e
            n += 1
        slots[i] = e * extent_slots + length[e]
        length[e] += 1
    return n


@njit(cache=True)
def held_totals(held, used, length, final, page_tokens):
    """Pure. Over the held extents: (tokens written, reserved slots: unwritten slots of used pages the
    sequence will fill, internal slots: used slots past its final length)."""
    token = reserved = internal = 0
    for e in range(held.shape[0]):
        if held[e]:
            used_slots = used[e] * page_tokens
            filled = min(used_slots, final[e])
            token += length[e]
            reserved += filled - length[e]
            internal += used_slots - filled
    return token, reserved, internal


@njit(cache=True)
def pick_extents(held, mapped, out):
    """Pure but for `out`. `PagePool.pick`'s order: writes into `out` (int64 [count]) the released extents with
    the most mapped pages, the lowest index among equals; returns how many there were (fewer than `count` when
    too few are released). Each pass takes the first released extent after the previous pick in that order."""
    for c in range(out.shape[0]):
        best = -1
        for e in range(held.shape[0]):
            if held[e] or (best >= 0 and mapped[e] <= mapped[best]):
                continue
            if c > 0 and (mapped[e] > mapped[out[c - 1]] or (mapped[e] == mapped[out[c - 1]] and e <= out[c - 1])):
                continue  # picked already: at or before the previous pick
            best = e
        if best < 0:
            return c
        out[c] = best
    return out.shape[0]


# The page pool's counters (`PagePool.counts`, int64 [NUM_COUNTS]): pages unmapped, pages mapped and unused
# (cached: sum of mapped - used), and pages ever mapped (a reused page is not mapped again).
FREE, CACHED, MAPPED_TOTAL, NUM_COUNTS = range(4)

# An unmapping log (int64 [rows, 3]) gets one row (extent, first page, pages) per unmapping; each function that
# logs takes the next free row `n` and returns the next free row after its own.


@njit(cache=True)
def available(counts):
    """Pure. Pages a sequence can still get: free plus reclaimable cached ones."""
    return counts[FREE] + counts[CACHED]


@njit(cache=True)
def reclaim(counts, mapped, used, count, log, n):
    """Unmap `count` cached pages (mapped > used), from the tails of the highest-numbered extents first."""
    e = mapped.shape[0] - 1
    while count > 0 and e >= 0:
        if mapped[e] > used[e]:
            drop = min(count, mapped[e] - used[e])
            mapped[e] -= drop
            log[n, 0], log[n, 1], log[n, 2] = e, mapped[e], drop
            n += 1
            counts[CACHED] -= drop
            counts[FREE] += drop
            count -= drop
        e -= 1
    return n


@njit(cache=True)
def count_mappings(counts, mapped, used, count, log, n):
    """`count` pages are about to be mapped (the caller adds them to `mapped`): free ones, reclaiming cached ones
    first where too few are free."""
    n = reclaim(counts, mapped, used, count - counts[FREE], log, n)
    counts[FREE] -= count
    counts[MAPPED_TOTAL] += count
    return n


@njit(cache=True)
def opened(counts, mapped, used, reused, to_map, log, n):
    """Held extents used more pages (`open_page`): `reused` of their own mapped pages, and one new mapping at the
    end of each extent of `to_map` (int64 [k], repeats allowed); the caller checked that the pool can supply
    them."""
    counts[CACHED] -= reused
    n = count_mappings(counts, mapped, used, to_map.shape[0], log, n)
    for i in range(to_map.shape[0]):
        mapped[to_map[i]] += 1
    return n


@njit(cache=True)
def can_take(counts, mapped, extents, needed):
    """Pure. Whether these distinct released extents (int64 [k]) can each use `needed[i]` pages: their own
    mapped pages first, then new mappings of free pages or reclaimed cached ones other than those."""
    total = reused = 0
    for i in range(extents.shape[0]):
        total += needed[i]
        reused += min(needed[i], mapped[extents[i]])
    return total - reused <= available(counts) - reused


@njit(cache=True)
def take(counts, mapped, used, held, extents, needed, log, n):
    """Sequences get these distinct released extents, each using `needed[i]` pages: first the extent's own mapped
    pages, then new mappings (reclaiming other cached pages if free ones run out). The caller checked `can_take`."""
    for i in range(extents.shape[0]):
        e = extents[i]
        reused = min(needed[i], mapped[e])
        held[e] = True
        used[e] = reused
        counts[CACHED] -= reused
    for i in range(extents.shape[0]):
        e = extents[i]
        new = needed[i] - used[e]
        n = count_mappings(counts, mapped, used, new, log, n)
        mapped[e] += new
        used[e] = needed[i]
    return n


@njit(cache=True)
def release(counts, mapped, used, held, extent, reuse, log, n):
    """The extent's sequence is gone: its pages stay mapped as cache (`reuse`) or are unmapped."""
    held[extent] = False
    if reuse:
        counts[CACHED] += used[extent]
    else:
        counts[CACHED] -= mapped[extent] - used[extent]
        counts[FREE] += mapped[extent]
        if mapped[extent]:
            log[n, 0], log[n, 1], log[n, 2] = extent, 0, mapped[extent]
            n += 1
        mapped[extent] = 0
    used[extent] = 0
    return n


@njit(cache=True)
def can_open(counts, pages, reused):
    """Pure. Whether held extents can use `pages` more pages, `reused` of them mapped in them already: the others
    are new mappings, of free pages or reclaimed cached ones other than those."""
    return pages - reused <= available(counts) - reused


@njit(cache=True)
def page_table_bytes(num_pages, free_pages, num_buffers, num_seqs):
    """Pure. The driver's page tables: one 8-byte PTE per mapped page in each layer's K and V buffer (NVIDIA's
    Pascal-and-later GMMU format), plus the 8-byte (kv_start, kv_len) int32 descriptor per sequence that the kernel
    reads."""
    return 8 * (num_pages - free_pages) * num_buffers + 8 * num_seqs


def extents_refused(free_extents: int, num_seqs: int, max_batch: int) -> str:
    """The refusal of an admission that finds too few released extents."""
    return f"{free_extents} free virtual extents for {num_seqs} sequences (--max-batch {max_batch} all in use)"


def pages_refused(needed: int, page_tokens: int, available_pages: int) -> str:
    """The refusal of an admission whose pages cannot be had."""
    return f"needs {needed} pages of {page_tokens} tokens, {available_pages} can be mapped"
