"""The clock's GEMM-shape efficiency, its prefill/decode split, and the named clock profiles."""

from __future__ import annotations

import dataclasses

import pytest

from workbench.clock.profiles import PROFILE_FLAGS, PROFILES, make_clock
from workbench.clock.roofline import GEMM_SHAPE_POINTS, RooflineClock, gemm_shape_frac
from workbench.clock.step_cost import StepCost
from workbench.config import RunConfig
from workbench.paper.fit_block_costs import fit_kernel, fit_swap
from workbench.paper.fit_clock import weight_streaming_eff_bw
from workbench.presets import GPUS, MODELS


def test_gemm_shape_fraction_grows_with_tokens():
    tokens = [1, 16, 64, 100, 128, 300, 512, 1000, 2048, 3000, 4096, 100_000]
    fracs = [gemm_shape_frac(t) for t in tokens]
    assert fracs == sorted(fracs)
    assert fracs[0] == GEMM_SHAPE_POINTS[0][1] and fracs[-1] == GEMM_SHAPE_POINTS[-1][1]  # flat outside
    for t, f in GEMM_SHAPE_POINTS:
        assert gemm_shape_frac(t) == pytest.approx(f)
    # linear in log2(tokens) between the points: 181 is halfway (in log2) from 128 to 256
    (t0, f0), (t1, f1) = GEMM_SHAPE_POINTS[1], GEMM_SHAPE_POINTS[2]
    assert gemm_shape_frac(round((t0 * t1) ** 0.5)) == pytest.approx((f0 + f1) / 2, abs=1e-3)


def _llama7b_clock(**kw) -> RooflineClock:
    cfg = RunConfig(model="llama-2-7b", gpu="a100-80gb", **kw)
    model = MODELS["llama-2-7b"]
    return RooflineClock(model, GPUS["a100-80gb"], model.kv_bytes_per_token("fp16"), 16, eff_bw=cfg.eff_bw,
                         eff_flops=cfg.eff_flops, step_overhead_s=cfg.step_overhead_s)


def test_default_roofline_pins_the_prefill_decode_split():
    """Llama-2-7B on an A100-80GB, 512-token prompts and 128-token outputs (the setting of the Vidur
    comparison): a lone prefill is compute bound at ~0.7 of dense peak (the GEMM curve fitted to Vidur's
    profiled A100 projections), a decode step memory bound; their durations are pinned."""
    clock = _llama7b_clock()
    prefill_s = clock.step_s(512, 512, 512 * 513 // 2, 0, 0)
    decode_s = clock.step_s(1, 640, 640, 0, 0)
    prefill_eff = clock.flops_per_s * gemm_shape_frac(512) / 312e12
    assert 0.68 <= prefill_eff <= 0.72
    body_params = 6.74e9 - 2 * 32000 * 4096  # the embedding is a lookup; the output layer runs for one row
    linear_s = 2 * body_params * 512 / (312e12 * prefill_eff)
    assert prefill_s == pytest.approx(0.035706, rel=2e-3) and prefill_s > linear_s  # plus the rest
    # weights (13.5 GB) over 0.8 x 2,039 GB/s = 8.26 ms, plus 32 layers' launches and element-wise kernels
    assert decode_s == pytest.approx(0.010710, rel=2e-3)
    assert prefill_s / decode_s == pytest.approx(3.334, rel=5e-3)


def _cost(prefill: int, decode: int, decode_ctx: int) -> StepCost:
    return StepCost(num_prefill_tokens=prefill, num_decode_tokens=decode, kv_read_tokens=decode_ctx + prefill,
                    attn_query_ctx=decode_ctx + prefill * (prefill + 1) // 2, decode_ctx_tokens=decode_ctx,
                    unshared_block_slots=0, num_running=decode + 1, copied_blocks=0, swapped_blocks=0)


def test_separate_prefill_costs_a_mixed_step_as_two_iterations():
    fused, separate = _llama7b_clock(), _llama7b_clock()
    separate.separate_prefill = True
    mixed = _cost(300, 20, 8000)
    # the 20 decoding sequences and the prompt sample: 21 rows through the output layer
    assert fused.cost_s(mixed) == pytest.approx(fused.step_s(320, 8300, 8000 + 300 * 301 // 2, 0, 0,
                                                             sampled_tokens=21))
    assert separate.cost_s(mixed) == pytest.approx(separate.step_s(20, 8000, 8000, 0, 0, sampled_tokens=20)
                                                   + separate.step_s(300, 300, 300 * 301 // 2, 0, 0))
    assert separate.cost_s(mixed) > fused.cost_s(mixed)
    for pure in (_cost(0, 20, 8000), _cost(300, 0, 0)):  # one kind of work: one iteration either way
        assert separate.cost_s(pure) == pytest.approx(fused.cost_s(pure))


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_a_profile_fixes_its_constants_and_rejects_flags_it_fixes(name):
    profile = PROFILES[name]
    cfg = RunConfig(clock_profile=name, gpu=profile.gpus[0] if profile.gpus else "a100-40gb")
    clock = make_clock(cfg, cfg.resolve(), 16, paged_kernel=True)
    for flag in PROFILE_FLAGS:
        if getattr(profile, flag) is not None:
            with pytest.raises(ValueError, match=f"fixes {flag}"):
                dataclasses.replace(cfg, **{flag: getattr(cfg, flag) / 2})
    assert clock.separate_prefill == profile.separate_prefill
    expected_overhead = profile.step_overhead_s if profile.step_overhead_s is not None else cfg.step_overhead_s
    assert clock.step_overhead_s == expected_overhead
    if profile.gpus:
        other = next(g for g in GPUS if g not in profile.gpus)
        with pytest.raises(ValueError, match="was fitted on gpu"):
            dataclasses.replace(cfg, gpu=other)


def _opt13b_clock(block_size: int, profile: str = "vllm-sosp23-a100", paged_kernel: bool = True) -> RooflineClock:
    cfg = RunConfig(model="opt-13b", gpu="a100-40gb", clock_profile=profile)
    return make_clock(cfg, cfg.resolve(), block_size, paged_kernel=paged_kernel)


def _decode(decode_blocks: int = 0, swapped_blocks: int = 0) -> StepCost:
    """30 sequences decoding at 500 tokens of context each."""
    return StepCost(num_prefill_tokens=0, num_decode_tokens=30, kv_read_tokens=15_000, attn_query_ctx=15_000,
                    decode_ctx_tokens=15_000, unshared_block_slots=0, num_running=30, copied_blocks=0,
                    swapped_blocks=swapped_blocks, decode_blocks=decode_blocks)


def test_the_paged_kernel_pays_a_fixed_cost_per_block_visit():
    """vllm-sosp23-a100: 1.6 ns per KV block, query head and layer (Fig. 18a); OPT-13B has 40 heads
    and 40 layers, so 100 blocks cost 100 x 40 x 40 x 1.6 ns = 0.256 ms, and the same 15,000 tokens
    of context read in blocks of 1 (15,000 blocks) instead of 16 (30 x 32 = 960) cost 36.0 ms more."""
    clock = _opt13b_clock(16)
    assert clock.cost_s(_decode(100)) - clock.cost_s(_decode(0)) == pytest.approx(0.000256, rel=1e-9)
    assert clock.cost_s(_decode(15_000)) - clock.cost_s(_decode(960)) == pytest.approx(0.0359424, rel=1e-9)
    # a contiguous kernel reads each sequence as one extent, and the default roofline has no such term
    for flat in (_opt13b_clock(16, paged_kernel=False), _opt13b_clock(16, profile="roofline")):
        assert flat.cost_s(_decode(15_000)) == flat.cost_s(_decode(0))
    # a measured attention time is the real kernel's, per-block costs included
    assert clock.cost_s(_decode(100), 0.01) == clock.cost_s(_decode(0), 0.01)


def test_a_swap_costs_its_bytes_over_the_link_plus_a_fixed_cost_per_copy():
    """vllm-sosp23-a100 (Fig. 19a): 12.4 GB/s and 2.57 us per copy, a copy per layer for keys and for
    values. A block of 16 OPT-13B tokens: 16 x 819,200 B / 12.4 GB/s = 1.05703 ms + 80 x 2.57 us =
    0.2056 ms. The default roofline: bytes over 25 GB/s, copies free."""
    one_block = _opt13b_clock(16).cost_s(_decode(swapped_blocks=1)) - _opt13b_clock(16).cost_s(_decode())
    assert one_block == pytest.approx(16 * 819_200 / 12.4e9 + 80 * 2.57e-6, rel=1e-9)
    assert one_block == pytest.approx(0.00126263, rel=1e-5)
    roofline = _opt13b_clock(16, profile="roofline")
    assert roofline.cost_s(_decode(swapped_blocks=1)) - roofline.cost_s(_decode()) == pytest.approx(
        16 * 819_200 / 25e9, rel=1e-9)
    # Fig. 19a: 256 tokens out and back in take 137.4 ms in blocks of 1 and 33.5 ms in blocks of 256
    for block_size, paper_ms in ((1, 137.4), (16, 40.1), (256, 33.5)):
        clock = _opt13b_clock(block_size)
        swap_s = clock.cost_s(_decode(swapped_blocks=2 * 256 // block_size)) - clock.cost_s(_decode())
        assert swap_s * 1e3 == pytest.approx(paper_ms, abs=3.0)


def test_the_profile_holds_the_fitted_block_costs():
    profile = PROFILES["vllm-sosp23-a100"]
    link_gbps, s_per_copy, swap_residuals_ms = fit_swap()
    _, s_per_visit, _ = fit_kernel()
    assert profile.host_link_gbps == round(link_gbps, 1)
    assert profile.swap_s_per_transfer == pytest.approx(s_per_copy, rel=2e-3)
    assert profile.attn_s_per_block == pytest.approx(s_per_visit, rel=2e-3)
    assert max(abs(swap_residuals_ms)) < 3.0


def test_a_prompt_iteration_pays_its_own_overhead_under_separate_prefill():
    """vLLM 0.1 ran prompts and decodes as separate iterations, each with its own overhead: a prompt-only
    step and the prompt half of a mixed step pay `prefill_overhead_s`, a decode iteration `step_overhead_s`.
    Without separate iterations (every profile but the paper's) there is one overhead, whatever is set."""
    fused, separate = _llama7b_clock(), _llama7b_clock()
    separate.separate_prefill = True
    prompt_only, decode_only, mixed = _cost(300, 0, 0), _cost(0, 20, 8000), _cost(300, 20, 8000)
    before = {name: separate.cost_s(cost) for name, cost in
              (("prompt", prompt_only), ("decode", decode_only), ("mixed", mixed))}
    separate.prefill_overhead_s = separate.step_overhead_s + 0.005
    assert separate.cost_s(prompt_only) == pytest.approx(before["prompt"] + 0.005, rel=1e-12)
    assert separate.cost_s(decode_only) == before["decode"]
    assert separate.cost_s(mixed) == pytest.approx(before["mixed"] + 0.005, rel=1e-12)
    fused_before = fused.cost_s(prompt_only)
    fused.prefill_overhead_s = fused.step_overhead_s + 0.005
    assert fused.cost_s(prompt_only) == fused_before


def test_the_paper_profile_charges_the_fitted_overheads_by_iteration_kind():
    """vllm-sosp23-a100: a decode iteration of OPT-13B pays step_overhead_s, a lone prompt (a preempted
    sequence's recomputation, §7.3) prefill_overhead_s; the two differ (docs/clock-profiles.md)."""
    profile = PROFILES["vllm-sosp23-a100"]
    assert profile.separate_prefill and profile.prefill_overhead_s != profile.step_overhead_s
    clock = _opt13b_clock(16)
    prompt = StepCost(num_prefill_tokens=256, num_decode_tokens=0, kv_read_tokens=256,
                      attn_query_ctx=256 * 257 // 2, decode_ctx_tokens=0, unshared_block_slots=0, num_running=1,
                      copied_blocks=0, swapped_blocks=0)
    assert clock.cost_s(prompt) == pytest.approx(clock.step_s(256, 256, 256 * 257 // 2, 0, 0)
                                                 - profile.step_overhead_s + profile.prefill_overhead_s)


def test_the_paper_profile_takes_its_bandwidth_from_vidurs_weight_streaming_layers():
    """eff_bw is not fitted to the paper: it is the fraction of the datasheet bandwidth at which the clock's
    A100 layer takes Vidur's profiled time where the projections only stream weights (1-32 rows)."""
    median, per_rows = weight_streaming_eff_bw()
    assert PROFILES["vllm-sosp23-a100"].eff_bw == round(median, 2)
    assert all(abs(bw - median) < 0.05 for bw in per_rows.values())  # one bandwidth holds at every row count
