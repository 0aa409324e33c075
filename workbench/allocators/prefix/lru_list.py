"""The order of `eviction.LRUPolicy` as a doubly linked list over block ids, in arrays under compiled loops
(vLLM v1's `FreeKVCacheBlockQueue`): least recently used at the head, O(1) per block, no Python object per
block.

State: `prev`, `next` (int32 [num_blocks], -1 at the ends), `queued` (bool [num_blocks]), `last` (int64
[num_blocks], the tick of a block's last use, 0 when forgotten) and `ends` (int64 [4]: head, tail, length,
the clock's tick). The owner grows the per-block arrays.
"""

from __future__ import annotations

import numpy as np
from numba import njit

HEAD, TAIL, LENGTH, TICK = 0, 1, 2, 3
NONE = -1


def empty_ends() -> np.ndarray:
    return np.array([NONE, NONE, 0, 0], dtype=np.int64)


@njit(cache=True)
def _link_before(prev, nxt, ends, block, after):
    """Links `block` in before `after` (NONE: at the back)."""
    before = ends[TAIL] if after == NONE else prev[after]
    prev[block], nxt[block] = before, after
    if before == NONE:
        ends[HEAD] = block
    else:
        nxt[before] = block
    if after == NONE:
        ends[TAIL] = block
    else:
        prev[after] = block


@njit(cache=True)
def _unlink(prev, nxt, ends, block):
    before, after = prev[block], nxt[block]
    if before == NONE:
        ends[HEAD] = after
    else:
        nxt[before] = after
    if after == NONE:
        ends[TAIL] = before
    else:
        prev[after] = before


@njit(cache=True)
def _join(prev, nxt, queued, ends, block, after):
    """`block` (not queued) joins the queue before `after` (NONE: at the back)."""
    _link_before(prev, nxt, ends, block, after)
    queued[block] = True
    ends[LENGTH] += 1


@njit(cache=True)
def _leave(prev, nxt, queued, ends, block):
    """`block` leaves the queue if it is in it."""
    if queued[block]:
        _unlink(prev, nxt, ends, block)
        queued[block] = False
        ends[LENGTH] -= 1


@njit(cache=True)
def _use(last, ends, block):
    ends[TICK] += 1
    last[block] = ends[TICK]


@njit(cache=True)
def add_many(prev, nxt, queued, last, ends, blocks):
    """Mutates. Each of `blocks` (not queued, distinct) is used now, in order, and joins the back."""
    for j in range(blocks.shape[0]):
        _use(last, ends, blocks[j])
        _join(prev, nxt, queued, ends, blocks[j], NONE)


@njit(cache=True)
def claim_many(prev, nxt, queued, last, ends, blocks):
    """Mutates. Each of `blocks` leaves the queue if in it and is used now (a hit), in order."""
    for j in range(blocks.shape[0]):
        _leave(prev, nxt, queued, ends, blocks[j])
        _use(last, ends, blocks[j])


@njit(cache=True)
def touch(prev, nxt, queued, last, ends, block):
    """Mutates. `block` is used now: a queued block moves to the back."""
    _use(last, ends, block)
    if queued[block]:
        _unlink(prev, nxt, ends, block)
        _link_before(prev, nxt, ends, block, NONE)


@njit(cache=True)
def remove(prev, nxt, queued, ends, block):
    """Mutates. `block` leaves the queue; nothing happens if it is not in it."""
    _leave(prev, nxt, queued, ends, block)


@njit(cache=True)
def restore(prev, nxt, queued, last, ends, block):
    """Mutates. `block` (not queued) rejoins the queue at its last use's place: before the first queued
    block used later."""
    after = ends[HEAD]
    while after != NONE and last[after] <= last[block]:
        after = nxt[after]
    _join(prev, nxt, queued, ends, block, after)


@njit(cache=True)
def pop_victims(prev, nxt, queued, last, ends, out):
    """Mutates. The `out.shape[0]` (<= length) least recently used blocks leave the queue, in order, into
    `out`; their last uses are forgotten."""
    for j in range(out.shape[0]):
        block = ends[HEAD]
        _leave(prev, nxt, queued, ends, block)
        last[block] = 0
        out[j] = block


@njit(cache=True)
def in_order(nxt, ends, out):
    """Writes the queue into `out` (sized for its length), head first; returns how many were written
    (fewer than `ends[LENGTH]` only if the links are broken)."""
    block, n = ends[HEAD], 0
    while block != NONE and n < out.shape[0]:
        out[n] = block
        n += 1
        block = nxt[block]
    return n
