"""A paged pool's slot accounting, each change and each derived figure stated once.

`PagedStrategy`'s verbs (admit, extend, fork, append, free, swap, draft rollback) and the compiled step loop
(workbench.engine.compiled_paged) change the same int64 array through these functions, and both take a
snapshot's internal fragmentation from `internal_frag_slots`, so a run through either loop leaves the figures a
step row reads as the other would.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# counts: int64 [NUM_COUNTS]
WRITTEN = 0  # distinct written slots of held blocks (a snapshot's token_slots)
LOGICAL = 1  # sum of the on-device sequences' lengths
ENTRIES = 2  # sum of the on-device sequences' table lengths
NUM_COUNTS = 3


def new_counts() -> np.ndarray:
    return np.zeros(NUM_COUNTS, dtype=np.int64)


def admission_blocks(num_blocks, num_hit, allocatable, revived):
    """An admission of a prompt held in `num_blocks` blocks, the first `num_hit` of them prefix hits (`revived` of
    those cached, held by no sequence), in a pool with `allocatable` blocks it may take (free or evictable):
    (the fresh blocks it takes, the blocks it may take them from: all but the revived hits, which it holds
    itself). The pool refuses it when the first is the larger. Plain Python, for the strategy's admission;
    `admission_blocks_compiled` is the same function for the compiled step loop."""
    return num_blocks - num_hit, allocatable - revived


admission_blocks_compiled = njit(cache=True)(admission_blocks)


@njit(cache=True)
def added(counts, tokens, num_seqs, num_blocks, written_before):
    """A group of `num_seqs` sequences now holds `tokens` more tokens each in `num_blocks` more table entries
    each (an admission, an extension, a fork), of which `written_before` slots were written already
    (prefix hits, a fork's parent): the group writes the rest once, for all its sequences."""
    counts[WRITTEN] += tokens - written_before
    counts[LOGICAL] += num_seqs * tokens
    counts[ENTRIES] += num_seqs * num_blocks


@njit(cache=True)
def appended(counts, num_rows, copied_slots, grown_entries):
    """A decode batch of `num_rows` sequences wrote one slot each, and its copies on write `copied_slots` again
    (a copied slot now exists twice); its tables grew by `grown_entries`."""
    counts[WRITTEN] += num_rows + copied_slots
    counts[LOGICAL] += num_rows
    counts[ENTRIES] += grown_entries


@njit(cache=True)
def released(counts, written_slots, tokens, entries):
    """Sequences holding `tokens` tokens in `entries` table entries left the device (freed, swapped out, or
    rolled back), and the blocks they alone held took `written_slots` written slots with them."""
    counts[WRITTEN] -= written_slots
    counts[LOGICAL] -= tokens
    counts[ENTRIES] -= entries


@njit(cache=True)
def restored(counts, written_slots, tokens, entries):
    """`released`'s inverse: sequences swapped back in hold `tokens` tokens in `entries` table entries again,
    in blocks holding `written_slots` written slots."""
    counts[WRITTEN] += written_slots
    counts[LOGICAL] += tokens
    counts[ENTRIES] += entries


@njit(cache=True)
def internal_frag_slots(held_slots, written_slots, reserved_slots, state_slots):
    """Slots of held blocks that hold no token, will hold none (not reserved) and hold no recurrent state (a
    snapshot's internal fragmentation: the unwritten tails of last blocks no holder will fill)."""
    return held_slots - written_slots - reserved_slots - state_slots
