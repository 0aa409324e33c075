"""The clock per operator: each operator its own max(memory, compute), summed, plus launches."""

from __future__ import annotations

import pytest

from workbench.clock.operators import forward_pass
from workbench.clock.roofline import (
    ELEMENTWISE_BW_FRAC,
    GEMM_SHAPE_POINTS,
    KERNEL_LAUNCH_S,
    RooflineClock,
    gemm_shape_frac,
    operator_s,
)
from workbench.clock.step_cost import CostMeter
from workbench.engine.plan import Prefill
from workbench.paper import fit_operators
from workbench.presets import GPUS, MODELS

# intermediate_size in each model's Hugging Face config.json: the MLP width params_b leaves must match it
MLP_WIDTH = {"llama-2-7b": 11008, "llama-2-13b": 13824, "llama-2-70b": 28672, "llama-3-8b": 14336,
             "mistral-7b": 14336, "qwen2.5-7b": 18944, "opt-13b": 20480, "opt-66b": 36864, "opt-175b": 49152,
             "gemma-2-9b": 14336, "mistral-7b-v0.1": 14336}


@pytest.mark.parametrize("name", sorted(n for n, m in MODELS.items() if not m.is_moe))
def test_the_operators_hold_the_models_parameters(name):
    """The projections per row and the output layer per sampled row are 2 FLOPs per parameter; the
    embedding is a gather (no FLOPs); their weights plus an untied embedding table are params_b."""
    model = MODELS[name]
    fp = forward_pass(model)
    embedding = model.vocab_size * model.hidden
    body = model.params_b * 1e9 - embedding * (1 if model.tied_embeddings else 2)
    # a recurrent layer's own FLOPs (its conv and recurrence) stand in for 2 per parameter of what it holds
    # outside its projections
    recurrent = sum(g.num_layers * (g.mixer.recurrence_flops_per_token() - 2 * g.mixer.local_params)
                    for g in model.state_groups)
    assert sum(op.flops_per_row for op in fp.per_row) == pytest.approx(2 * body + recurrent, rel=1e-9)
    assert next(op for op in fp.per_row if op.name == "embedding").flops_per_row == 0.0
    assert fp.output.flops_per_row == 2.0 * embedding
    weights = sum(op.weight_bytes for op in (*fp.per_row, fp.output))
    assert weights + (0 if model.tied_embeddings else 2 * embedding) == pytest.approx(model.weight_bytes(), rel=1e-9)
    if name in MLP_WIDTH:
        ffn = fp.mlp_params / ((3 if model.gated_mlp else 2) * model.hidden)
        assert ffn == pytest.approx(MLP_WIDTH[name], rel=0.02)


def _clock(model="llama-3-8b", gpu="h100-sxm") -> RooflineClock:
    m = MODELS[model]
    return RooflineClock(m, GPUS[gpu], m.kv_bytes_per_token("fp16"), 16, eff_bw=0.8, eff_flops=0.75,
                         step_overhead_s=0.001)


@pytest.mark.parametrize("tokens, kv_read, attn_ctx, sampled", [
    (1, 640, 640, 1), (150, 150 * 900, 150 * 900, 150), (2048, 2048, 2048 * 2049 // 2, 1), (512, 4096, 10**6, 0)])
def test_a_step_is_its_operators_each_at_its_own_bound(tokens, kv_read, attn_ctx, sampled):
    clock = _clock()
    rate = clock.flops_per_s * gemm_shape_frac(tokens)
    ops_s = sum(operator_s(op, tokens, clock.bytes_per_s, rate) for op in clock.forward.per_row)
    if sampled:
        output_rate = clock.flops_per_s * gemm_shape_frac(sampled)
        ops_s += operator_s(clock.forward.output, sampled, clock.bytes_per_s, output_rate)
    kv_bytes = (tokens + kv_read) * clock.kv_bytes_per_token + tokens * clock.attn_bytes_per_row
    attention_s = max(kv_bytes / clock.bytes_per_s, attn_ctx * clock.attn_flops_per_key / rate)
    expected = ops_s + attention_s + clock.attention_launch_s + clock.step_overhead_s
    assert clock.step_s(tokens, kv_read, attn_ctx, 0, 0, sampled_tokens=sampled) == pytest.approx(expected, rel=1e-12)
    # one max over the step's totals would let the memory-bound operators hide under the compute-bound ones
    all_ops = (*clock.forward.per_row, clock.forward.output)
    bytes_total = sum(op.weight_bytes + op.bytes_per_row * tokens for op in all_ops) + kv_bytes
    flops_total = sum(op.flops_per_row * tokens for op in all_ops) + attn_ctx * clock.attn_flops_per_key
    assert expected > max(bytes_total / clock.bytes_per_s, flops_total / rate) + clock.step_overhead_s


def test_element_wise_kernels_cost_bytes_and_launches_and_no_flops():
    clock = _clock()
    norm = next(op for op in clock.forward.per_row if op.name == "norm")
    assert not norm.gemm and norm.flops_per_row == 0 and norm.kernels == 2 * MODELS["llama-3-8b"].num_layers
    rows = 4096
    expected = norm.bytes_per_row * rows / (clock.bytes_per_s * ELEMENTWISE_BW_FRAC) + norm.kernels * KERNEL_LAUNCH_S
    assert operator_s(norm, rows, clock.bytes_per_s, clock.flops_per_s) == pytest.approx(expected, rel=1e-12)


def test_the_output_layer_runs_only_for_the_rows_that_sample():
    """A prefill chunk that does not end its prompt samples nothing; each decoding sequence samples."""
    clock = _clock()
    out = clock.forward.output
    none = clock.step_s(512, 512, 512 * 513 // 2, 0, 0, sampled_tokens=0)
    one = clock.step_s(512, 512, 512 * 513 // 2, 0, 0, sampled_tokens=1)
    assert one - none == pytest.approx(operator_s(out, 1, clock.bytes_per_s, clock.gemm_flops_per_s(1)), rel=1e-9)
    # the 1.05B embedding and output parameters are not charged as FLOPs for each of a prompt's tokens
    model = MODELS["llama-3-8b"]
    charged = sum(op.flops_per_row for op in clock.forward.per_row)
    assert charged == pytest.approx(2 * (model.params_b * 1e9 - 2 * model.vocab_size * model.hidden), rel=1e-9)


def test_the_cost_meter_counts_the_sampled_rows():
    meter = CostMeter(16)
    meter.add(100, 3, 0, +1)  # three decoding sequences
    ending = Prefill(0, (1, 2), 50, 0, 50, 0, 50, completes=True)  # a 2-sequence group whose prompt ends
    chunk = Prefill(1, (3,), 4000, 0, 512, 0, 512, completes=False)  # the first chunk of a long prompt
    assert meter.cost(3, [ending, chunk], [], 0, 0).sampled_tokens == 3 + 2
    assert meter.cost(3, [chunk], [], 0, 0).sampled_tokens == 3


def test_the_constants_are_the_fit_to_vidurs_profile():
    """`python -m workbench.paper.fit_operators` reproduces the constants roofline.py holds (rounded)."""
    launch_s, frac = fit_operators.fit_elementwise()
    assert KERNEL_LAUNCH_S == pytest.approx(launch_s, abs=0.05e-6)
    assert ELEMENTWISE_BW_FRAC == pytest.approx(frac, abs=0.005)
    fitted = fit_operators.fit_gemm_shape(launch_s)
    assert [t for t, _ in fitted] == [t for t, _ in GEMM_SHAPE_POINTS]
    for (_, f), (_, held) in zip(fitted, GEMM_SHAPE_POINTS, strict=True):
        assert held == pytest.approx(f, abs=0.005)
