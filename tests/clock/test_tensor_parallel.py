"""Tensor parallelism (`--tp N`): KV capacity from N GPUs' memory, the clock's shards and all-reduces."""

from __future__ import annotations

import math

import pytest

from workbench.clock.profiles import make_clock
from workbench.clock.roofline import (
    ACTIVATION_BYTES,
    ALLREDUCE_LATENCY_S,
    GPU_LINK_EFF,
    KERNEL_LAUNCH_S,
    RooflineClock,
    operator_s,
)
from workbench.config import RunConfig
from workbench.engine.simulation import run
from workbench.presets import GIB, GPUS, MODELS, kv_capacity_slots


def test_capacity_is_the_gpus_memory_less_the_weights_once():
    model, gpu = MODELS["opt-66b"], GPUS["a100-40gb"]
    per_gpu_bytes = (40 * 0.9 - 1.0) * GIB
    expected = math.floor((4 * per_gpu_bytes - 2 * 65.7e9) / model.kv_bytes_per_token("fp16"))
    assert kv_capacity_slots(model, "fp16", gpu=gpu, num_gpus=4) == expected
    assert RunConfig(model="opt-66b", gpu="a100-40gb", tp=4).resolve().capacity_slots == expected
    with pytest.raises(ValueError, match="leaves no KV memory on a100-40gb"):
        RunConfig(model="opt-66b", gpu="a100-40gb", tp=1).resolve()


def test_tp_must_split_whole_kv_heads():
    with pytest.raises(ValueError, match=r"tp \(3\) must divide the model's 8 kv heads"):
        RunConfig(model="llama-3-8b", gpu="h100-sxm", tp=3).resolve()


def _clock(tp: int, **kw) -> RooflineClock:
    return RooflineClock(MODELS["opt-66b"], GPUS["a100-40gb"], MODELS["opt-66b"].kv_bytes_per_token("fp16"), 16,
                         eff_bw=0.8, eff_flops=0.7, step_overhead_s=0.001, tp=tp, **kw)


@pytest.mark.parametrize("num_tokens, kv_read_tokens, attn_ctx", [(1, 0, 0), (32, 32 * 500, 32 * 500),
                                                                   (2048, 0, 2048 * 1024)])
def test_a_step_is_its_shards_in_parallel_plus_two_all_reduces_per_layer(num_tokens, kv_read_tokens, attn_ctx):
    """Each GPU does 1/N of the split operators (projections, rope, activation, output layer, attention)
    and the whole of the replicated ones (norms, residual adds, the embedding gather); every GPU launches
    every kernel; two all-reduces per layer."""
    model, gpu = MODELS["opt-66b"], GPUS["a100-40gb"]
    one = _clock(1)
    rate = one.gemm_flops_per_s(num_tokens)
    for tp in (2, 4, 8):
        ops_s = 0.0
        for op in (*one.forward.per_row, one.forward.output):
            work_s = operator_s(op, num_tokens if op in one.forward.per_row else 1, one.bytes_per_s, rate,
                                kernel_launch_s=0.0)
            ops_s += work_s / (tp if op.split else 1) + op.kernels * KERNEL_LAUNCH_S
        kv_bytes = (num_tokens + kv_read_tokens) * one.kv_bytes_per_token + num_tokens * one.attn_bytes_per_row
        attention_s = max(kv_bytes / one.bytes_per_s, attn_ctx * one.attn_flops_per_key / rate)
        hidden_bytes = model.hidden * ACTIVATION_BYTES
        ring_s = 2 * (tp - 1) / tp * hidden_bytes * num_tokens / (gpu.gpu_link_gb_s * 1e9 * GPU_LINK_EFF)
        all_reduces_s = 2 * model.num_layers * (ALLREDUCE_LATENCY_S + ring_s)
        expected = (ops_s + attention_s / tp + one.attention_launch_s + all_reduces_s + one.step_overhead_s)
        assert _clock(tp).step_s(num_tokens, kv_read_tokens, attn_ctx, 0, 0) == pytest.approx(expected, rel=1e-12)


def test_per_block_costs_and_host_links_split_over_the_gpus():
    one, four = _clock(1, attn_s_per_block=1e-9, swap_s_per_transfer=2e-6), _clock(4, attn_s_per_block=1e-9,
                                                                                 swap_s_per_transfer=2e-6)
    assert four.attn_s_per_block_read == pytest.approx(one.attn_s_per_block_read / 4)
    assert four.link_bytes_per_s == pytest.approx(4 * one.link_bytes_per_s)
    assert four.swap_fixed_s_per_block == one.swap_fixed_s_per_block  # every GPU copies its shard at once


def test_tp_1_is_the_single_gpu_clock():
    cfg = RunConfig(model="llama-3-8b", gpu="h100-sxm", kv_gib=10)
    clock = make_clock(cfg, cfg.resolve(), 16, paged_kernel=True)
    assert clock.allreduce_fixed_s == 0 and clock.allreduce_s_per_token == 0


def test_a_tensor_parallel_run_serves_more_and_steps_faster(tmp_path):
    base = dict(model="llama-2-70b", gpu="a100-80gb", kernel="none", workload="sharegpt-like", rate=20.0,
                num_requests=200, seed=0, strategy="paged")
    two = run(RunConfig(**base, tp=2), tmp_path / "tp2")
    four = run(RunConfig(**base, tp=4), tmp_path / "tp4")
    assert four["kv_slots"] > 2 * two["kv_slots"]  # the weights are paid once, the memory four times
    assert four["num_finished"] == two["num_finished"] == 200
    assert four["tpot_p50_s"] < two["tpot_p50_s"]
