"""The quantizing fp8 cache write: float → e4m3 in the CUDA C (CPU shim), the Numba twin and the reference
quantizer, bit for bit, and the CUDA C conversion against NVIDIA's own (cuda_fp8.hpp)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from kernel_cases import e4m3_edge_values, fp8_write_rows, sample_f32

from workbench import kernels
from workbench.engine.kvpool import KVContent, KVPool
from workbench.kernels import cuda_cpu, fp8

HERE = Path(__file__).resolve().parent
PROBE_ENTRY = HERE / "fp8_probe_entry.cpp"
BACKENDS = ["numba", "cuda-cpu", "reference"]
F32_TINY = 2.0**-126


def _shim_or_skip():
    try:
        cuda_cpu.shim_include_dir()
    except cuda_cpu.ShimBuildError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def probe():
    _shim_or_skip()
    lib = ctypes.CDLL(str(cuda_cpu.build_library(PROBE_ENTRY)))
    lib.probe_e4m3.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong]
    lib.probe_e4m3_sweep.argtypes = [ctypes.c_uint, ctypes.c_uint, ctypes.c_longlong, ctypes.c_void_p]
    lib.probe_e4m3_sweep.restype = ctypes.c_longlong
    lib.probe_e4m3_decode.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong]
    return lib


def test_both_fp8_decodes_give_every_code_pair_exactly(probe):
    """The attention kernel widens fp8 codes with NVIDIA's conversion on sm_89+ and with integer operations
    elsewhere (value / 256, the shim's path): every pair of codes in either half of a word decodes to the same
    value both ways, NaN to NaN, and to the e4m3 table's value."""
    pairs = np.arange(1 << 16, dtype=np.uint32)
    words = pairs | (pairs[::-1] << 16)
    ours, nvidia = (np.full(4 * len(words), -1.0, dtype=np.float32) for _ in range(2))
    probe.probe_e4m3_decode(words.ctypes.data, ours.ctypes.data, nvidia.ctypes.data, len(words))
    np.testing.assert_array_equal(ours * 256, nvidia)
    codes = words.view(np.uint8)  # little-endian: code k of word i is byte 4i + k
    np.testing.assert_array_equal(nvidia, fp8.E4M3_VALUES[codes].astype(np.float32))


def test_cuda_conversion_matches_nvidia_cvt_on_a_sweep_of_float32(probe):
    """kv_common.cuh's float_to_e4m3 against __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) on every
    65th float32 bit pattern (66M patterns, all exponents) and on the ties and boundaries."""
    first_bad = ctypes.c_uint(0)
    assert probe.probe_e4m3_sweep(7, 65, (1 << 32) // 65, ctypes.byref(first_bad)) == 0, hex(first_bad.value)
    x = e4m3_edge_values()
    ours, nvidia = np.zeros(len(x), np.uint8), np.ones(len(x), np.uint8)
    probe.probe_e4m3(x.ctypes.data, ours.ctypes.data, nvidia.ctypes.data, len(x))
    np.testing.assert_array_equal(ours, nvidia)


@pytest.mark.slow
def test_cuda_conversion_matches_nvidia_cvt_on_every_float32(probe):
    first_bad = ctypes.c_uint(0)
    assert probe.probe_e4m3_sweep(0, 1, 1 << 32, ctypes.byref(first_bad)) == 0, hex(first_bad.value)


def test_reference_quantizer_matches_nvidia_cvt(probe):
    """fp8.quantize (scale 1) is the same rounding as NVIDIA's conversion on every fp16 value, a float32 sample
    and the ties (float32 subnormals, which the write flushes first, round to ±0 in both anyway)."""
    x = np.concatenate([np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32),
                        sample_f32(np.random.default_rng(3), 1 << 20)])
    ours, nvidia = np.zeros(len(x), np.uint8), np.ones(len(x), np.uint8)
    probe.probe_e4m3(x.ctypes.data, ours.ctypes.data, nvidia.ctypes.data, len(x))
    np.testing.assert_array_equal(fp8.quantize(x), nvidia)
    np.testing.assert_array_equal(ours, nvidia)


@pytest.mark.parametrize("source", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("scales", [(1.0, 1.0), (0.37, 3.0), (2.0**-20, 3.0e5), (F32_TINY, 1.0)])
def test_quantizing_write_is_bit_identical_across_backends(source, scales):
    """Every fp16 / bf16 bit pattern (subnormals, ties, saturation, inf, NaN) and a float32 sample, written
    through each backend with k_scale / v_scale, give the reference quantizer's codes; negative slots and
    slots not in the mapping keep their old codes."""
    rng = np.random.default_rng([len(source), int(scales[0] * 1e6) % 1000])
    rows = fp8_write_rows(source, rng)
    num_tokens = rows.shape[0]
    slots = rng.permutation(num_tokens + 40)[:num_tokens].astype(np.int64)  # [num_tokens] of num_tokens + 40 slots
    slots[rng.random(num_tokens) < 0.1] = -1
    values = (rows.astype(np.uint32) << 16).view(np.float32) if source == "bf16" else rows  # exact as float32
    written = slots >= 0
    for backend in BACKENDS:
        if backend == "cuda-cpu":
            _shim_or_skip()
        k_pool = np.full((num_tokens + 40, 2, 64), 0x55, np.uint8)
        v_pool = k_pool.copy()
        kernels.cache_write(k_pool, v_pool, rows, rows[::-1].copy(), slots, backend=backend, k_scale=scales[0],
                            v_scale=scales[1])
        np.testing.assert_array_equal(k_pool[slots[written]], fp8.quantize(values[written], scales[0]), backend)
        np.testing.assert_array_equal(v_pool[slots[written]], fp8.quantize(values[::-1][written], scales[1]), backend)
        untouched = np.setdiff1d(np.arange(len(k_pool)), slots[written])
        assert (k_pool[untouched] == 0x55).all() and (v_pool[untouched] == 0x55).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_quantizing_write_flushes_float32_subnormals_and_saturates(backend):
    """x / scale in float32: a float32-subnormal x is ±0 even when the scale would make it large (what a GPU
    built with flush-to-zero computes), a normal x divided past 448 saturates, NaN stays NaN."""
    if backend == "cuda-cpu":
        _shim_or_skip()
    x = np.array([2.0**-127, -(2.0**-127), 2.0**-126, -(2.0**-126), 1.0, np.inf, -np.inf, np.nan], np.float32)
    rows = np.zeros((1, 1, 8), np.float32)
    rows[0, 0] = x
    k_pool, v_pool = np.zeros((2, 1, 8), np.uint8), np.zeros((2, 1, 8), np.uint8)
    kernels.cache_write(k_pool, v_pool, rows, rows, np.array([1], np.int64), backend=backend,
                        k_scale=2.0**-126, v_scale=1.0)
    assert k_pool[1, 0].tolist() == [0x00, 0x80, 0x38, 0xB8, 0x7E, 0x7E, 0xFE, 0x7F]  # 2^-126 / 2^-126 = 1.0
    assert v_pool[1, 0].tolist() == [0x00, 0x80, 0x00, 0x80, 0x38, 0x7E, 0xFE, 0x7F]
    assert (k_pool[0] == 0).all()


def test_quantizing_write_validates_rows_and_scales():
    pool = np.zeros((4, 1, 2), np.uint8)
    rows = np.ones((2, 1, 2), np.float16)
    slots = np.array([0, 1], np.int64)
    with pytest.raises(ValueError, match="k_scale must be a normal float32"):
        kernels.cache_write(pool, pool.copy(), rows, rows, slots, k_scale=0.0)
    with pytest.raises(ValueError, match="v_scale must be a normal float32"):
        kernels.cache_write(pool, pool.copy(), rows, rows, slots, v_scale=1e-40)
    with pytest.raises(ValueError, match="v_new must be float16"):
        kernels.cache_write(pool, pool.copy(), rows, rows.astype(np.float32), slots)
    with pytest.raises(ValueError, match="k_new must be uint8"):
        kernels.cache_write(pool, pool.copy(), rows.astype(np.int8), rows, slots)
    f16_pool = np.zeros((4, 1, 2), np.float16)
    with pytest.raises(ValueError, match="k_scale / v_scale apply to fp8 pools"):
        kernels.cache_write(f16_pool, f16_pool.copy(), rows, rows, slots, k_scale=0.5)


@pytest.mark.parametrize("backend", ["numba", "cuda-cpu"])
def test_engine_pool_quantizes_the_model_rows_it_is_given(backend):
    """The engine writes an fp8 pool with the model's fp16 rows; the pool then holds the codes the verifier's
    reference reads (`KVContent.rows`)."""
    if backend == "cuda-cpu":
        _shim_or_skip()
    content = KVContent(num_kv_heads=2, head_dim=64, kv_dtype="fp8")
    hashes = np.random.default_rng(5).integers(0, 1 << 63, size=40, dtype=np.uint64)
    k_model, v_model = content.model_rows(hashes)
    assert k_model.dtype == np.float16 and v_model.dtype == np.float16
    pool = KVPool(num_slots=64, host_slots=0, num_kv_heads=2, head_dim=64, kv_dtype="fp8", backend=backend)
    slots = np.arange(64, dtype=np.int64)[::-1][:40].copy()
    pool.write(slots, k_model, v_model)
    k_codes, v_codes = content.rows(hashes)
    np.testing.assert_array_equal(pool.k[slots], k_codes)
    np.testing.assert_array_equal(pool.v[slots], v_codes)
    assert len(np.unique(k_codes)) > 100  # content spans many codes, so a wrong rounding would show
