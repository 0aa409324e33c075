"""The pool verbs of `virtual-contiguous` in the compiled step loop (workbench.engine.compiled_paged).

Each is the strategy's verb for one sequence, over the arrays `CompiledExtentPool.views` lends (the tuple `V`,
in that order; `step_loop` builds nothing of it), made of the functions of `virtual.loops` that the strategy
and its `PagePool` call:
  choose     `VirtualContiguous._choose`: an extent (`pick_extents`) and whether its pages can be had (`can_take`)
  place      `VirtualContiguous._place`: the extent takes its pages (`take`), filled to the prompt
  append     `VirtualContiguous.append_if_room`: `openings`, `can_open`, `apply_append`, `opened`
  release    `VirtualContiguous.free`: `release`
  snapshot   `VirtualContiguous.snapshot`'s counts (`held_totals`, `page_table_bytes`)
A row's sequence lives in its extent (V[EXTENT][row]); lengths are per extent.
"""

from __future__ import annotations

from numba import njit

from workbench import intmath
from workbench.allocators.virtual import loops
from workbench.allocators.virtual.compiled_pool import (
    EXTENT_SLOTS,
    MAX_BATCH,
    NUM_BUFFERS,
    NUM_PAGES,
    PAGE_TOKENS,
    REUSE,
)

# called only from the compiled loop: no wrapper for Python callers is built (less to compile)
_inner = njit(cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)

# V: CompiledExtentPool.views
EXTENT, LENGTH, FINAL, MAPPED, USED, HELD, COUNTS, CONSTS, EXTENTS, TO_MAP, SLOTS, PICKED, NEEDED, LOG = range(14)

# why `choose` found no place (the loop's event codes name them)
NO_EXTENT, NO_PAGES = 1, 2


@_inner
def allocatable_slots(V):
    """`VirtualContiguous.num_allocatable_blocks`: slots of the pages a request can get now (block size 1)."""
    return loops.available(V[COUNTS]) * V[CONSTS][PAGE_TOKENS]


@_inner
def choose(V, tokens):
    """`VirtualContiguous._choose` for one sequence of `tokens` tokens: (0, extent, pages) where it can be placed
    (the extent in V[PICKED], its pages in V[NEEDED]), else (NO_EXTENT, free extents, --max-batch) or (NO_PAGES,
    pages needed, pages that can be mapped), the numbers of the refusal's words (`loops.extents_refused`,
    `loops.pages_refused`)."""
    picked, needed, counts = V[PICKED], V[NEEDED], V[COUNTS]
    if loops.pick_extents(V[HELD], V[MAPPED], picked) < 1:
        return NO_EXTENT, 0, V[CONSTS][MAX_BATCH]
    needed[0] = intmath.cdiv(tokens, V[CONSTS][PAGE_TOKENS])  # as `VirtualContiguous._choose` counts them
    if not loops.can_take(counts, V[MAPPED], picked, needed):
        return NO_PAGES, needed[0], loops.available(counts)
    return 0, picked[0], needed[0]


@_inner
def place(V, row, tokens, final):
    """`VirtualContiguous._place` of the sequence in `row` after `choose` found it a place: its extent takes the
    pages, holding `tokens` of `final`."""
    extent = V[PICKED][0]
    loops.take(V[COUNTS], V[MAPPED], V[USED], V[HELD], V[PICKED], V[NEEDED], V[LOG], 0)
    V[LENGTH][extent] = tokens
    V[FINAL][extent] = final
    V[EXTENT][row] = extent


@_inner
def append(V, rows):
    """`VirtualContiguous.append_if_room` for the sequences in `rows`: their next slots, mapping the pages they
    open; False, with nothing changed, when the pool cannot supply them."""
    c, counts, length, mapped, used = V[CONSTS], V[COUNTS], V[LENGTH], V[MAPPED], V[USED]
    extents = V[EXTENTS][:rows.shape[0]]
    for i in range(rows.shape[0]):
        extents[i] = V[EXTENT][rows[i]]
    opening, reused = loops.openings(extents, length, mapped, used, c[PAGE_TOKENS])
    if not loops.can_open(counts, opening, reused):
        return False
    n = loops.apply_append(extents, length, mapped, used, c[PAGE_TOKENS], c[EXTENT_SLOTS], V[SLOTS], V[TO_MAP])
    loops.opened(counts, mapped, used, reused, V[TO_MAP][:n], V[LOG], 0)
    return True


@_inner
def release(V, row):
    """`VirtualContiguous.free` of the sequence in `row`: its extent's pages stay mapped (reuse) or are unmapped."""
    loops.release(V[COUNTS], V[MAPPED], V[USED], V[HELD], V[EXTENT][row], V[CONSTS][REUSE] != 0, V[LOG], 0)


@_inner
def length_of(V, row):
    """Tokens written by the sequence in `row`."""
    return V[LENGTH][V[EXTENT][row]]


@_inner
def snapshot(V, num_seqs):
    """`VirtualContiguous.snapshot`'s counts with `num_seqs` sequences on the device: (token, reserved, internal,
    cached, free slots, page-table bytes)."""
    c, counts = V[CONSTS], V[COUNTS]
    p = c[PAGE_TOKENS]
    token, reserved, internal = loops.held_totals(V[HELD], V[USED], V[LENGTH], V[FINAL], p)
    table_bytes = loops.page_table_bytes(c[NUM_PAGES], counts[loops.FREE], c[NUM_BUFFERS], num_seqs)
    return token, reserved, internal, counts[loops.CACHED] * p, counts[loops.FREE] * p, table_bytes


@_inner
def mapped_total(V):
    """Pages ever mapped (`VirtualContiguous.mapped_pages`), whose growth the clock prices."""
    return V[COUNTS][loops.MAPPED_TOTAL]
