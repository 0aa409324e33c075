"""FP8 E4M3 KV storage (vLLM's `kv_cache_dtype=fp8`, OCP "e4m3fn"): 1 sign, 4 exponent (bias 7), 3
mantissa bits; no infinities, NaN = S.1111.111, largest finite 448. A pool holds the bits as uint8;
a per-tensor scale maps them back: value = e4m3(bits) * scale (vLLM's k_scale / v_scale).

`quantize` is the cache write's rounding, the definition the CUDA C (`kv_common.cuh`
`float_to_e4m3`) and the Numba twin (`numba_cache.float_to_e4m3`) match bit for bit: x / scale in
float32 (vLLM's `__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3)`), float32-subnormal
inputs counted as zero first (what a GPU compiled with flush-to-zero does, made explicit so every
backend agrees). Every kernel and the reference decode the same stored bits with `E4M3_VALUES`, so
verification compares like with like.
"""

from __future__ import annotations

import numpy as np

E4M3_MAX = 448.0
E4M3_NAN_BITS = np.uint8(0x7F)
F32_TINY = float(np.finfo(np.float32).tiny)  # 2^-126, the smallest normal float32


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
_FINITE_CODES = np.arange(0x7F)  # the non-negative finite codes 0x00..0x7E, ascending values (not 0x80: -0)


def quantize(x: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """float values → e4m3 bits (uint8, same shape) of float32(x) / float32(scale), divided in float32:
    round to nearest, ties to even mantissa, saturating at ±448 (vLLM's saturating cast, ±inf included);
    NaN → NaN bits (0x7F); float32-subnormal x → ±0. `scale` must be a normal float32."""
    with np.errstate(over="ignore", invalid="ignore"):  # beyond float32: ±inf, saturating; NaN stays NaN
        x32 = np.asarray(x, dtype=np.float32)
        x32 = np.where(np.abs(x32) < F32_TINY, np.copysign(np.float32(0), x32), x32)
        y = (x32 / np.float32(scale)).astype(np.float64)  # IEEE float32 division, then exact
    magnitude = np.minimum(np.abs(y), E4M3_MAX)
    grid = E4M3_VALUES[_FINITE_CODES].astype(np.float64)  # [127] ascending
    upper = np.clip(np.searchsorted(grid, magnitude), 1, len(grid) - 1)
    below, above = grid[upper - 1], grid[upper]
    pick_above = (magnitude - below > above - magnitude) | (
        (magnitude - below == above - magnitude) & (_FINITE_CODES[upper - 1] & 1 == 1))
    codes = np.where(pick_above, _FINITE_CODES[upper], _FINITE_CODES[upper - 1]).astype(np.uint8)
    codes |= np.where(np.signbit(y), np.uint8(0x80), np.uint8(0))
    return np.where(np.isnan(y), E4M3_NAN_BITS, codes).astype(np.uint8)
