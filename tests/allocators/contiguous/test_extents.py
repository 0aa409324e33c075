"""Placement policies against a slot bitmap: first fit, best fit, buddy (random place/release walks)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.allocators.contiguous.extents import BuddyPlacer, RunPlacer, make_placer

OPS = st.lists(st.tuples(st.booleans(), st.integers(1, 40), st.integers(0, 10**6)), min_size=1, max_size=120)


def free_runs(used: np.ndarray) -> list[tuple[int, int]]:
    """Maximal (start, size) runs of free slots in a bitmap."""
    runs, start = [], None
    for i, u in enumerate([*used.tolist(), True]):
        if not u and start is None:
            start = i
        elif u and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


@pytest.mark.parametrize("best", [False, True])
@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 200), ops=OPS)
def test_run_placer_matches_the_bitmap_reference(best, capacity, ops):
    placer = RunPlacer(capacity, best=best)
    used = np.zeros(capacity, dtype=bool)
    live: list[tuple[int, int]] = []
    for is_place, size, pick in ops:
        if is_place or not live:
            runs = [r for r in free_runs(used) if r[1] >= size]
            expected = None
            if runs:
                expected = min(runs, key=lambda r: (r[1], r[0]))[0] if best else runs[0][0]
            got = placer.place(size)
            assert (got[0] if got else None) == expected
            if got:
                used[got[0]:got[0] + size] = True
                live.append(got)
        else:
            start, size = live.pop(pick % len(live))
            placer.release(start, size)
            used[start:start + size] = False
        placer.check()
        assert placer.free_slots == int((~used).sum())
        starts, sizes = placer.free_extents()
        assert list(zip(starts.tolist(), sizes.tolist(), strict=True)) == free_runs(used)


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(1, 300), ops=OPS)
def test_buddy_places_aligned_powers_of_two_from_the_smallest_fitting_block(capacity, ops):
    placer = BuddyPlacer(capacity)
    used = np.zeros(capacity, dtype=bool)
    live: list[tuple[int, int]] = []
    for is_place, size, pick in ops:
        if is_place or not live:
            rounded = placer.alloc_size(size)
            starts_before, sizes_before = placer.free_extents()
            got = placer.place(size)
            if got is None:
                assert not np.any(sizes_before >= rounded)
            else:
                start, alloc = got
                assert alloc == rounded and start % alloc == 0 and not used[start:start + alloc].any()
                # the lowest of the smallest free blocks that fit was halved down to the request
                smallest = sizes_before[sizes_before >= rounded].min()
                assert start == starts_before[sizes_before == smallest].min()
                halves = [rounded << k for k in range(int(smallest // rounded).bit_length() - 1)]
                expected = sorted([*sizes_before.tolist(), *halves])
                expected.remove(smallest)
                assert sorted(placer.free_sizes().tolist()) == expected
                used[start:start + alloc] = True
                live.append(got)
        else:
            start, alloc = live.pop(pick % len(live))
            placer.release(start, alloc)
            used[start:start + alloc] = False
        placer.check()
        assert placer.free_slots == int((~used).sum()) == int(placer.free_sizes().sum())
    for start, alloc in live:
        placer.release(start, alloc)
    assert sorted(placer.free_sizes().tolist()) == sorted(1 << k for k in range(capacity.bit_length())
                                                         if capacity >> k & 1)


def test_unknown_fit_is_refused():
    with pytest.raises(ValueError, match="first, best, buddy"):
        make_placer("worst", 10)
