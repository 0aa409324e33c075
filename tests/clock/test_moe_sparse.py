"""The clock on mixtures of experts (active FLOPs, the experts a step touches), latent attention's
constants and sparse attention's two terms (docs/clock-profiles.md)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.clock.roofline import KERNEL_LAUNCH_S, RooflineClock, operator_s
from workbench.clock.step_cost import CostMeter
from workbench.engine.groups import Group
from workbench.engine.plan import Prefill
from workbench.presets import GPUS, MODELS


def _clock(name: str, tp: int = 1) -> RooflineClock:
    m = MODELS[name]
    return RooflineClock(m, GPUS["h200"], m.kv_bytes_per_token("fp16"), 64, eff_bw=0.8, eff_flops=0.75,
                         step_overhead_s=0.001, tp=tp)


@pytest.mark.parametrize("rows", [1, 256])
def test_a_deepseek_v3_step_reads_the_experts_its_rows_touch(rows):
    """Hand formula: fp8 weights (1 byte); every parameter but the input embedding table (a gather) and the
    routed experts no row touches. With uniform routing a MoE layer's 256 experts are each untouched by
    `rows` rows with probability (1 − 8/256)^rows: 8 experts at batch 1, 255.92 at batch 256. FLOPs per row:
    2 × the active parameters (8 of the 256 routed experts)."""
    assert MODELS["deepseek-v3"].weight_dtype == "fp8"  # 1 byte a weight below
    clock = _clock("deepseek-v3")
    expert = 3 * 7168 * 2048
    table = 129280 * 7168
    touched = 256 * (1 - (1 - 8 / 256) ** rows)
    assert touched == pytest.approx(8.0 if rows == 1 else 255.92, abs=0.005)
    weights = 671e9 - table - 58 * (256 - touched) * expert
    ops = (*clock.forward.per_row, clock.forward.output)
    assert sum(op.weight_bytes_at(rows) for op in ops) == pytest.approx(weights, rel=1e-12)
    active_per_row = 671e9 - 2 * table - 58 * (256 - 8) * expert
    assert sum(op.flops_per_row for op in clock.forward.per_row) == pytest.approx(2 * active_per_row, rel=1e-12)
    # the routed experts' operator: its own max(bytes, FLOPs) plus two grouped GEMMs per MoE layer
    routed = next(op for op in clock.forward.per_row if op.name == "routed_experts")
    rate = clock.gemm_flops_per_s(rows)
    row_bytes = 58 * 8 * (7168 + 2 * 2048 + 2048 + 7168) * 2
    expected_s = max((58 * touched * expert + row_bytes * rows) / clock.bytes_per_s,
                     58 * 8 * 2.0 * expert * rows / rate) + 2 * 58 * KERNEL_LAUNCH_S
    assert operator_s(routed, rows, clock.bytes_per_s, rate) == pytest.approx(expected_s, rel=1e-12)
    assert clock.rows_s(rows) == pytest.approx(
        sum(operator_s(op, rows, clock.bytes_per_s, rate) for op in clock.forward.per_row), rel=1e-12)


def test_batch_1_reads_far_fewer_expert_bytes_than_batch_256():
    clock = _clock("deepseek-v3")
    routed = next(op for op in clock.forward.per_row if op.name == "routed_experts")
    assert routed.weight_bytes_at(256) / routed.weight_bytes_at(1) == pytest.approx(255.92 / 8, rel=1e-4)
    assert clock.rows_s(1) < clock.rows_s(256) / 10


def test_gpt_oss_120b_computes_its_5_13_b_active_parameters():
    """OpenAI's gpt-oss model card (arXiv 2508.10925, Table 1): 5.13 B active parameters per token, the
    output layer included: 4 of 128 experts of every layer, not all 116.8 B."""
    clock = _clock("gpt-oss-120b")
    flops = sum(op.flops_per_row for op in clock.forward.per_row) + clock.forward.output.flops_per_row
    assert flops / 2 == pytest.approx(5.13e9, rel=0.005)


def test_a_latent_kv_is_read_whole_by_every_tensor_parallel_gpu():
    one, eight = _clock("deepseek-v2-lite"), _clock("deepseek-v2-lite", tp=8)
    assert eight.kv_bytes_per_token == 8 * one.kv_bytes_per_token == 8 * 27 * 576 * 2
    assert eight.bytes_per_s == 8 * one.bytes_per_s  # so the KV read takes as long on 8 GPUs as on one
    # absorbed MLA: per head and key, q·c (512) and q_rope·k_rope (64) then p·c (512), 2 flops each
    assert one.attn_flops_per_key == 2.0 * 27 * 16 * (2 * 512 + 64)


def _brute(kv_lens, prefills, topk, latent_frac, index_frac, flop_ratio):
    """(kv read, attn ctx) by brute force: each decode query reads top min(ctx, k) latent rows and the
    indexer's key of every token; a prefill of [start, stop) reads min(stop, k × queries) latent rows and
    every indexer key; FLOPs per query: min(q + 1, k) attention keys and q + 1 indexer keys."""
    read = sum(latent_frac * min(k, topk) + index_frac * k for k in kv_lens)
    attn = sum(min(k, topk) + flop_ratio * k for k in kv_lens)
    for n, s, e in prefills:
        read += n * (latent_frac * min(e, topk * (e - s)) + index_frac * e)
        attn += sum(min(q + 1, topk) + flop_ratio * (q + 1) for q in range(s, e))
    return read, attn


@pytest.mark.parametrize("seed", range(3))
def test_sparse_attention_charges_the_indexer_scan_and_the_top_k(seed):
    model = MODELS["deepseek-v3.2"]
    topk = 40  # a small k, so that contexts cross it
    terms = tuple(t._replace(cap_tokens=topk) if t.cap_tokens else t for t in model.sparse_attention_terms())
    latent, index = 576 * 2, 132
    assert terms[0].read_frac == latent / (latent + index) and terms[1].read_frac == index / (latent + index)
    flop_ratio = 64 * 128 / (128 * (2 * 512 + 64))
    assert terms[1].flop_frac == flop_ratio and terms[0].flop_frac == 1.0
    rng = np.random.default_rng(seed)
    meter = CostMeter(64, terms)
    running: list[Group] = []
    for step in range(80):
        if rng.random() < 0.3:
            g = Group(step, None, 10_000, seq_ids=[0], kv_len=int(rng.integers(1, 90)))
            meter.add(g.kv_len, 1, step, +1)
            running.append(g)
        if running:
            meter.decoded(len(running), step)
            for g in running:
                g.kv_len += 1
        start = int(rng.integers(0, 60))
        prefills = [Prefill(-1, (0,), 0, start, 0, start, start + int(rng.integers(1, 50)), True)]
        cost = meter.cost(len(running), prefills, [], 0, 0)
        read, attn = _brute([g.kv_len for g in running], [(1, p.start, p.stop) for p in prefills], topk,
                            terms[0].read_frac, terms[1].read_frac, flop_ratio)
        assert cost.kv_read_tokens == pytest.approx(read, rel=1e-12)
        assert cost.attn_query_ctx == pytest.approx(attn, rel=1e-12)


def test_a_sparse_run_finishes_and_its_indexer_keys_take_room(tmp_path):
    from workbench.config import RunConfig
    from workbench.engine.simulation import run

    spec = ("custom:layers=4,heads=8,head_dim=32,kv_lora=64,rope_dim=16,index_heads=4,index_dim=128,"
            "index_topk=64,params_b=0.05,max_model_len=1024")
    base = dict(model=spec, kv_gib=0.05, kernel="none", workload="sharegpt-like", num_requests=30, rate=20.0)
    sparse = run(RunConfig(**base), tmp_path / "sparse")
    dense = run(RunConfig(**{**base, "model": spec.replace("index_heads=4,index_dim=128,index_topk=64,", "")}),
                tmp_path / "dense")
    assert sparse["num_finished"] == dense["num_finished"] == 30
    assert sparse["kv_slots"] < dense["kv_slots"]  # the indexer's keys take room in every block


def test_the_compiled_loop_leaves_sparse_attention_to_the_general_loop():
    """The compiled paged loop charges every key of every context; a sparse model's attention terms
    (the scheduler's attention_windows) keep its runs in the general loop, latent and MoE runs it models."""
    from workbench.allocators import registry
    from workbench.config import RunConfig
    from workbench.engine.compiled_paged import eligible
    from workbench.engine.simulation import make_replica
    from workbench.workload.build import build_workload

    latent = ("custom:layers=4,heads=8,head_dim=32,kv_lora=64,rope_dim=16,experts=4,experts_per_token=2,"
              "expert_width=64,params_b=0.05,max_model_len=1024")
    for model, expected in ((latent, True), (latent + ",index_heads=4,index_dim=128,index_topk=64", False)):
        cfg = RunConfig(model=model, kv_gib=0.05, kernel="none", num_requests=5, rate=5.0)
        res = cfg.resolve()
        replica = make_replica(cfg, res, registry.create_from_config(cfg, res), build_workload(cfg), "none")
        assert eligible.applies(replica) is expected
