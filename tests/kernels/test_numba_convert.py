"""The in-kernel fp16/bf16 → float32 converters, over all 65536 bit patterns."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from workbench.kernels.numba_attention import exp_nonpositive
from workbench.kernels.numba_convert import (
    TARGET_HAS_F16C,
    bf16_to_float,
    half_bits_to_float,
    half_fpext,
    half_to_float,
)

ALL_BITS = np.arange(1 << 16, dtype=np.uint16)  # [65536]


@njit(cache=True)
def _convert_all(bits, bf16):
    out = np.empty(bits.shape[0], dtype=np.float32)
    for i in range(bits.shape[0]):
        out[i] = bf16_to_float(bits[i]) if bf16 else half_to_float(bits[i])
    return out


@njit(cache=True)
def _convert_all_bit_route(bits):
    out = np.empty(bits.shape[0], dtype=np.float32)
    for i in range(bits.shape[0]):
        out[i] = half_bits_to_float(bits[i])
    return out


@njit(cache=True)
def _convert_all_fpext(bits):
    out = np.empty(bits.shape[0], dtype=np.float32)
    for i in range(bits.shape[0]):
        out[i] = half_fpext(bits[i])
    return out


def _half_routes():
    routes = [("kernel", lambda b: _convert_all(b, False)), ("bits", _convert_all_bit_route)]
    if TARGET_HAS_F16C:
        routes.append(("fpext", _convert_all_fpext))
    return routes


@pytest.mark.parametrize("route", _half_routes(), ids=lambda r: r[0])
def test_half_matches_numpy_float16_bit_for_bit(route):
    got = route[1](ALL_BITS)
    want = ALL_BITS.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert nan.sum() == 2 * 1023  # every exponent-31 pattern with a nonzero mantissa
    np.testing.assert_array_equal(np.isnan(got), nan)
    # bit equality keeps ±0, subnormals and ±inf honest; NaN payloads must survive too
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
    # sign and payload survive; the quiet bit (22) may be set by hardware conversion of a signaling NaN
    payload_mask = np.uint32(0xFFBFE000)
    np.testing.assert_array_equal(got.view(np.uint32)[nan] & payload_mask, want.view(np.uint32)[nan] & payload_mask)


@pytest.mark.parametrize("route", _half_routes(), ids=lambda r: r[0])
def test_half_subnormals_and_specials(route):
    got = route[1](np.array([0x0001, 0x03FF, 0x8001, 0x8000, 0x7C00, 0xFC00, 0x7BFF], np.uint16))
    assert got[0] == 2.0**-24 and got[1] == 1023 * 2.0**-24 and got[2] == -(2.0**-24)
    assert got[3] == 0 and np.signbit(got[3])
    assert got[4] == np.inf and got[5] == -np.inf and got[6] == 65504.0


def _bf16_value(bits: np.ndarray) -> np.ndarray:
    """bf16 values computed from sign/exponent/mantissa fields in float64, independent of bit casts."""
    sign = np.where(bits >> 15, -1.0, 1.0)
    exponent = ((bits >> 7) & 0xFF).astype(np.int64)
    mantissa = (bits & 0x7F).astype(np.float64)
    normal = np.ldexp(1.0 + mantissa / 128, exponent - 127)
    subnormal = np.ldexp(mantissa / 128, -126)
    value = np.where(exponent == 0, subnormal, normal)
    value = np.where(exponent == 255, np.where(mantissa == 0, np.inf, np.nan), value)
    return sign * value


def test_bf16_matches_field_decoding_for_all_patterns():
    with np.errstate(invalid="ignore"):  # widening signaling-NaN patterns raises the invalid flag
        got = _convert_all(ALL_BITS, True).astype(np.float64)
    want = _bf16_value(ALL_BITS)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_array_equal(got[finite], want[finite])
    np.testing.assert_array_equal(np.signbit(got[finite]), np.signbit(want[finite]))


def test_bf16_equals_float32_truncated_to_its_top_half():
    rng = np.random.default_rng(0)
    words = rng.integers(0, 1 << 32, size=200_000, dtype=np.uint64).astype(np.uint32)  # random float32 patterns
    truncated = (words & np.uint32(0xFFFF0000)).view(np.float32)
    got = _convert_all((words >> 16).astype(np.uint16), True)
    nan = np.isnan(truncated)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], truncated.view(np.uint32)[~nan])


@njit(cache=True)
def _exp_all(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = exp_nonpositive(x[i])
    return out


def test_exp_nonpositive_against_float64():
    x = np.concatenate([-np.logspace(-8, np.log10(87.0), 200_000), np.linspace(-87.0, 0.0, 100_001)])
    x = x.astype(np.float32)
    got = _exp_all(x).astype(np.float64)
    want = np.exp(x.astype(np.float64))
    rel = np.abs(got - want) / want
    assert rel.max() < 3e-7  # about 2 ulp of float32
    special = _exp_all(np.array([0.0, -0.0, -np.inf, np.nan, -87.5, -1e30], np.float32))
    assert special[0] == 1 and special[1] == 1 and special[2] == 0 and np.isnan(special[3])
    assert special[4] == 0 and special[5] == 0
