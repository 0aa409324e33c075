"""The clock's GEMM-shape efficiency, its prefill/decode split, and the named clock profiles."""

from __future__ import annotations

import dataclasses

import pytest

from workbench.clock import GEMM_SHAPE_POINTS, RooflineClock, gemm_shape_frac
from workbench.clock_profiles import PROFILE_FLAGS, PROFILES, make_clock
from workbench.config import RunConfig
from workbench.presets import GPUS, MODELS
from workbench.step_cost import StepCost


def test_gemm_shape_fraction_grows_with_tokens_to_one():
    tokens = [1, 16, 64, 100, 128, 300, 512, 1000, 2048, 3000, 4096, 100_000]
    fracs = [gemm_shape_frac(t) for t in tokens]
    assert fracs == sorted(fracs) and fracs[-1] == 1.0 and fracs[0] == GEMM_SHAPE_POINTS[0][1]
    for t, f in GEMM_SHAPE_POINTS:
        assert gemm_shape_frac(t) == pytest.approx(f)
    # linear in log2(tokens) between the points: 256 is halfway from 128 to 512
    assert gemm_shape_frac(256) == pytest.approx((0.60 + 0.83) / 2)


def _llama7b_clock(**kw) -> RooflineClock:
    cfg = RunConfig(model="llama-2-7b", gpu="a100-80gb", **kw)
    model = MODELS["llama-2-7b"]
    return RooflineClock(model, GPUS["a100-80gb"], model.kv_bytes_per_token("fp16"), 16, eff_bw=cfg.eff_bw,
                         eff_flops=cfg.eff_flops, step_overhead_s=cfg.step_overhead_s)


def test_default_roofline_pins_the_prefill_decode_split():
    """Llama-2-7B on an A100-80GB, 512-token prompts and 128-token outputs (the setting checked against
    Vidur's profiled A100 linear layers): a lone prefill is compute bound at 0.60-0.65 of dense peak,
    a decode step memory bound; their durations are pinned."""
    clock = _llama7b_clock()
    prefill_s = clock.step_s(512, 512, 512 * 513 // 2, 0, 0)
    decode_s = clock.step_s(1, 640, 640, 0, 0)
    prefill_eff = clock.flops_per_s * gemm_shape_frac(512) / 312e12
    assert 0.60 <= prefill_eff <= 0.65
    linear_s = 2 * 6.74e9 * 512 / (312e12 * prefill_eff)
    assert prefill_s == pytest.approx(0.03689, rel=2e-3) and prefill_s > linear_s  # plus attention, overhead
    assert decode_s == pytest.approx(0.009470, rel=2e-3)
    assert prefill_s / decode_s == pytest.approx(3.896, rel=5e-3)


def _cost(prefill: int, decode: int, decode_ctx: int) -> StepCost:
    return StepCost(num_prefill_tokens=prefill, num_decode_tokens=decode, kv_read_tokens=decode_ctx + prefill,
                    attn_query_ctx=decode_ctx + prefill * (prefill + 1) // 2, decode_ctx_tokens=decode_ctx,
                    unshared_block_slots=0, num_running=decode + 1, copied_blocks=0, swapped_blocks=0)


def test_separate_prefill_costs_a_mixed_step_as_two_iterations():
    fused, separate = _llama7b_clock(), _llama7b_clock()
    separate.separate_prefill = True
    mixed = _cost(300, 20, 8000)
    assert fused.cost_s(mixed) == pytest.approx(fused.step_s(320, 8300, 8000 + 300 * 301 // 2, 0, 0))
    assert separate.cost_s(mixed) == pytest.approx(separate.step_s(20, 8000, 8000, 0, 0)
                                                   + separate.step_s(300, 300, 300 * 301 // 2, 0, 0))
    assert separate.cost_s(mixed) > fused.cost_s(mixed)
    for pure in (_cost(0, 20, 8000), _cost(300, 0, 0)):  # one kind of work: one iteration either way
        assert separate.cost_s(pure) == pytest.approx(fused.cost_s(pure))


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_a_profile_fixes_its_constants_and_rejects_flags_it_fixes(name):
    profile = PROFILES[name]
    cfg = RunConfig(clock_profile=name, gpu=profile.gpu or "a100-40gb")
    clock = make_clock(cfg, cfg.resolve(), 16)
    for flag in PROFILE_FLAGS:
        if getattr(profile, flag) is not None:
            with pytest.raises(ValueError, match=f"fixes {flag}"):
                dataclasses.replace(cfg, **{flag: getattr(cfg, flag) / 2})
    assert clock.separate_prefill == profile.separate_prefill
    expected_overhead = profile.step_overhead_s if profile.step_overhead_s is not None else cfg.step_overhead_s
    assert clock.step_overhead_s == expected_overhead
    if profile.gpu is not None:
        other = next(g for g in GPUS if g != profile.gpu)
        with pytest.raises(ValueError, match="was fitted on gpu"):
            dataclasses.replace(cfg, gpu=other)
