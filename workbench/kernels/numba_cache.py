"""Numba cache kernels over byte views of the pools: one compiled specialization serves every KV dtype.

Each pool arrives as uint8 [num_slots, row_bytes] (a C-contiguous view, so writes land in the
caller's array).
"""

from __future__ import annotations

from numba import njit, prange


@njit(parallel=True, cache=True)
def scatter_rows(pool, new_rows, slot_mapping):
    """pool[slot_mapping[i]] = new_rows[i] for every slot >= 0. Mutates pool (slots must be distinct)."""
    for i in prange(slot_mapping.shape[0]):
        slot = slot_mapping[i]
        if slot >= 0:
            pool[slot, :] = new_rows[i, :]


@njit(parallel=True, cache=True)
def copy_blocks(src_pool, dst_pool, pairs, block_size):
    """Block pairs[i, 1] of dst_pool gets block pairs[i, 0] of src_pool. Mutates dst_pool.

    Parallel over pairs: safe because destinations are distinct and no destination is a source.
    """
    for i in prange(pairs.shape[0]):
        src = pairs[i, 0] * block_size
        dst = pairs[i, 1] * block_size
        for offset in range(block_size):
            dst_pool[dst + offset, :] = src_pool[src + offset, :]
