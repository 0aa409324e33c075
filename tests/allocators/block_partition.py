"""The blocks the test models' sequences hold, recounted from their slot mappings alone (`alloc_model`,
`hybrid_model`): one array pass over every held slot, not a Python set per block."""

from __future__ import annotations

import numpy as np


def block_partition(parts, unit: int) -> tuple[np.ndarray, np.ndarray]:
    """(written, reach) per block held, int64 [blocks] each, in block order. `parts`: (slots, start, final) per
    sequence, `slots` int [n] the slots of its positions [start, start + n) (`start` a multiple of `unit`). Each
    run of `unit` positions from `start` belongs to the block of its first slot: that block's written slots are
    the distinct slots its runs map to, and its reach the most any holder will write into it (min(final − i,
    unit) for the run at position i)."""
    slot_blocks, slot_values, run_blocks, run_reach = [], [], [], []
    for slots, start, final in parts:
        slots = np.asarray(slots, dtype=np.int64)
        if not slots.shape[0]:
            continue
        run_starts = np.arange(0, slots.shape[0], unit)
        blocks = slots[run_starts] // unit
        slot_blocks.append(blocks[np.arange(slots.shape[0]) // unit])
        slot_values.append(slots)
        run_blocks.append(blocks)
        run_reach.append(np.minimum(final - (start + run_starts), unit))
    if not slot_blocks:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    values = np.concatenate(slot_values)
    span = int(values.max()) + 1
    pairs = np.unique(np.concatenate(slot_blocks) * span + values)  # (block, slot) once each
    held, written = np.unique(pairs // span, return_counts=True)
    blocks, reach = np.concatenate(run_blocks), np.concatenate(run_reach)
    order = np.argsort(blocks, kind="stable")
    blocks, reach = blocks[order], reach[order]
    firsts = np.flatnonzero(np.concatenate([[True], blocks[1:] != blocks[:-1]]))
    assert np.array_equal(blocks[firsts], held)  # a run's block holds the run's first slot
    return written.astype(np.int64), np.maximum.reduceat(reach, firsts).astype(np.int64)
