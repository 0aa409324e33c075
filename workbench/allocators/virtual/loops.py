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
