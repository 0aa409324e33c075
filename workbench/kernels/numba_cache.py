"""Numba cache kernels over byte views of the pools: one compiled specialization serves every KV dtype.

Each pool arrives as uint8 [num_slots, row_bytes] (a C-contiguous view, so writes land in the
caller's array). The fp8 write quantizes instead: the twin of `write_cache_fp8` in
kernels/cache_ops.cu, with the same integer rounding (`float_to_e4m3`).

Serial on purpose: a step writes a few rows to a prefill's few thousand (a memcpy of kilobytes to a few
megabytes), so a parallel region would cost more in thread wake-up and spinning workers than the copy,
and the attention kernel's threads already use every core.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from workbench.kernels.numba_convert import FP16, FP32, bf16_to_float, bits_to_float, float_to_bits, half_to_float


@njit(cache=True)
def scatter_rows(pool, new_rows, slot_mapping):
    """pool[slot_mapping[i]] = new_rows[i] for every slot >= 0. Mutates pool (slots must be distinct)."""
    for i in range(slot_mapping.shape[0]):
        slot = slot_mapping[i]
        if slot >= 0:
            pool[slot, :] = new_rows[i, :]


@njit(inline="always", cache=True)
def float_to_e4m3(x):
    """float32 → e4m3 code (uint8): round to nearest, ties to even, saturating at ±448, NaN → 0x7F.
    Line for line kv_common.cuh's `float_to_e4m3` (integer operations on the bits, here in int64)."""
    bits = np.int64(float_to_bits(x))
    sign = (bits >> 24) & 0x80
    magnitude = bits & 0x7FFFFFFF
    if magnitude > 0x7F800000:  # NaN
        return np.uint8(0x7F)
    if magnitude >= 0x43E00000:  # >= 448 saturates
        return np.uint8(sign | 0x7E)
    if magnitude >= 0x3C800000:  # >= 2^-6, a normal e4m3: keep 3 of 23 mantissa bits, carrying into the exponent
        rounded = magnitude + 0x7FFFF + ((magnitude >> 20) & 1)
        return np.uint8(sign | ((rounded >> 20) - (120 << 3)))
    if magnitude <= 0x3A800000:  # <= 2^-10, half the smallest subnormal: ±0
        return np.uint8(sign)
    mantissa = (magnitude & 0x7FFFFF) | 0x800000  # a subnormal e4m3: units of 2^-9, nearest even
    shift = 14 - ((magnitude >> 23) - 127)  # 21..24
    q = mantissa >> shift
    rest = mantissa & ((np.int64(1) << shift) - 1)
    half = np.int64(1) << (shift - 1)
    if rest > half or (rest == half and (q & 1) == 1):
        q += 1
    return np.uint8(sign | q)


@njit(inline="always", cache=True)
def scaled_e4m3(x, scale):
    """e4m3 code of float32 x / scale, a float32-subnormal x counted as a signed zero (kv_common.cuh)."""
    bits = float_to_bits(x)
    if bits & np.uint32(0x7F800000) == np.uint32(0):
        x = bits_to_float(bits & np.uint32(0x80000000))
    return float_to_e4m3(np.float32(np.float32(x) / scale))


@njit(cache=True)
def scatter_rows_fp8(pool, new_bits, slot_mapping, source, scale):
    """pool[slot_mapping[i], j] = e4m3 code of row i's element j / scale, for every slot >= 0. Mutates pool.

    pool: uint8 [num_slots, row_elems]; new_bits [num_tokens, row_elems]: uint32 bits of float32 rows
    (source FP32) or uint16 bits of fp16 / bf16 rows (FP16 / BF16); scale: float32.
    """
    for i in range(slot_mapping.shape[0]):
        slot = slot_mapping[i]
        if slot >= 0:
            for j in range(new_bits.shape[1]):
                word = new_bits[i, j]
                if source == FP32:
                    x = bits_to_float(word)
                elif source == FP16:
                    x = half_to_float(word)
                else:
                    x = bf16_to_float(word)
                pool[slot, j] = scaled_e4m3(x, scale)


@njit(cache=True)
def copy_blocks(src_pool, dst_pool, pairs, block_size):
    """Block pairs[i, 1] of dst_pool gets block pairs[i, 0] of src_pool. Mutates dst_pool.

    Destinations are distinct and no destination is a source, so the order of the pairs does not matter.
    """
    for i in range(pairs.shape[0]):
        src = pairs[i, 0] * block_size
        dst = pairs[i, 1] * block_size
        for offset in range(block_size):
            dst_pool[dst + offset, :] = src_pool[src + offset, :]
