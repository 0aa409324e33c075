"""KV element decoding for the Numba backend: 16-bit storage → float32.

Numba has no CPU float16, so fp16 and bf16 pools reach the kernels as uint16 bits. `KV_CODE` is
passed to the kernels as a plain int so that one compiled kernel serves every format.
"""

from __future__ import annotations

import numpy as np
from numba import njit

FP32, FP16, BF16 = 0, 1, 2
KV_CODE = {"fp32": FP32, "fp16": FP16, "bf16": BF16}


@njit(inline="always", cache=True)
def bits_to_float(bits):
    """uint32 bit pattern → the float32 with that representation."""
    return np.uint32(bits).view(np.float32)


@njit(inline="always", cache=True)
def half_to_float(bits):
    """IEEE binary16 bits → float32, exact for every pattern (subnormals, ±0, ±inf, NaN payloads)."""
    h = np.uint32(bits)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    exponent = (h >> np.uint32(10)) & np.uint32(0x1F)
    mantissa = h & np.uint32(0x3FF)
    if exponent == np.uint32(0x1F):  # inf / NaN: all-ones float32 exponent, payload kept
        return bits_to_float(sign | np.uint32(0x7F800000) | (mantissa << np.uint32(13)))
    if exponent == np.uint32(0):  # zero / subnormal: mantissa × 2^-24, exact in float32
        magnitude = np.float32(mantissa) * np.float32(5.960464477539063e-08)
        return -magnitude if sign else magnitude
    return bits_to_float(sign | ((exponent + np.uint32(112)) << np.uint32(23)) | (mantissa << np.uint32(13)))


@njit(inline="always", cache=True)
def bf16_to_float(bits):
    """bfloat16 bits → float32: bf16 is the top half of a float32, so this is exact."""
    return bits_to_float(np.uint32(bits) << np.uint32(16))


@njit(inline="always", cache=True)
def load_row(pool, slot, kv_head, kv_code, dst, row):
    """dst[row, :] = pool[slot, kv_head, :] (uint16 fp16 or bf16 bits) decoded to float32. Mutates dst only.

    One loop per format (not a branch per element) so that each loop vectorizes.
    """
    head_dim = dst.shape[1]
    if kv_code == FP16:
        for d in range(head_dim):
            dst[row, d] = half_to_float(pool[slot, kv_head, d])
    else:
        for d in range(head_dim):
            dst[row, d] = bf16_to_float(pool[slot, kv_head, d])
