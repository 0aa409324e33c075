"""FP8 E4M3 KV storage (vLLM's `kv_cache_dtype=fp8`, OCP "e4m3fn"): 1 sign, 4 exponent (bias 7), 3
mantissa bits; no infinities, NaN = S.1111.111, largest finite 448. A pool holds the bits as uint8;
a per-tensor scale maps them back: value = e4m3(bits) * scale (vLLM's k_scale / v_scale).

`quantize` is what a cache write applies to float K/V; every kernel and the reference decode the
same stored bits with `E4M3_VALUES`, so verification compares like with like.
"""

from __future__ import annotations

import numpy as np

E4M3_MAX = 448.0
E4M3_NAN_BITS = np.uint8(0x7F)


def _e4m3_values() -> np.ndarray:
    """float32 [256]: the value of every bit pattern (NaN for 0x7F and 0xFF)."""
    bits = np.arange(256)
    sign = np.where(bits & 0x80, -1.0, 1.0)
    exponent, mantissa = (bits >> 3) & 0xF, bits & 0x7
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0**-6, (1 + mantissa / 8) * 2.0 ** (exponent - 7.0))
    values = sign * magnitude
    values[(bits & 0x7F) == 0x7F] = np.nan
    return values.astype(np.float32)


E4M3_VALUES = _e4m3_values()  # float32 [256], exact
_FINITE_CODES = np.flatnonzero(np.isfinite(E4M3_VALUES) & (E4M3_VALUES >= 0))  # 0x00..0x7E, ascending values


def quantize(x: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """float values → e4m3 bits (uint8, same shape) of x / scale: round to nearest, ties to even mantissa,
    saturating at ±448 (vLLM's saturating cast); NaN → NaN bits."""
    y = np.asarray(x, dtype=np.float64) / scale
    magnitude = np.minimum(np.abs(y), E4M3_MAX)
    grid = E4M3_VALUES[_FINITE_CODES].astype(np.float64)  # [127] ascending
    upper = np.clip(np.searchsorted(grid, magnitude), 1, len(grid) - 1)
    below, above = grid[upper - 1], grid[upper]
    pick_above = (magnitude - below > above - magnitude) | (
        (magnitude - below == above - magnitude) & (_FINITE_CODES[upper - 1] & 1 == 1))
    codes = np.where(pick_above, _FINITE_CODES[upper], _FINITE_CODES[upper - 1]).astype(np.uint8)
    codes |= np.where(np.signbit(y), np.uint8(0x80), np.uint8(0))
    return np.where(np.isnan(y), E4M3_NAN_BITS, codes).astype(np.uint8)
