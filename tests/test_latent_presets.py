"""Latent KV (MLA), the sparse-attention indexer's keys, weight dtypes and mixture-of-experts presets:
bytes per token, capacity under tensor parallelism, and one-line errors (docs/memory.md)."""

from __future__ import annotations

import math

import pytest

from workbench.config import RunConfig
from workbench.engine.simulation import run
from workbench.presets import GIB, GPUS, MODELS, kv_capacity_slots, model_from_name
from workbench.run import main

LATENT = sorted(n for n, m in MODELS.items() if m.kv_layout == "latent")
SMALL_LATENT = "custom:layers=2,heads=4,head_dim=16,kv_lora=32,rope_dim=16,params_b=0.01,max_model_len=512"


def test_the_latent_presets_are_the_2026_models():
    assert set(LATENT) == {"deepseek-v3", "deepseek-r1", "deepseek-v3.2", "kimi-k2", "deepseek-v2-lite"}


@pytest.mark.parametrize("name", LATENT)
@pytest.mark.parametrize("dtype,nbytes", [("fp32", 4), ("fp16", 2), ("bf16", 2), ("fp8", 1)])
def test_a_latent_token_is_one_row_of_latent_and_rotary_key_per_layer(name, dtype, nbytes):
    """No factor 2 for K and V and no factor of heads: one (kv_lora_rank + qk_rope_head_dim) row serves both
    and every head; the indexer's fp8 key and its fp32 scale add 128 + 4 bytes per layer."""
    m = MODELS[name]
    indexer = 128 + 4 if m.index_heads else 0
    assert m.kv_bytes_per_token(dtype) == m.num_layers * ((512 + 64) * nbytes + indexer)


def test_deepseek_v3_is_70272_bytes_a_token_and_v32_adds_its_indexer():
    assert MODELS["deepseek-v3"].kv_bytes_per_token("fp16") == 61 * 576 * 2 == 70_272
    assert MODELS["deepseek-v3.2"].kv_bytes_per_token("fp16") == 61 * (576 * 2 + 132) == 78_324
    assert MODELS["deepseek-v3.2"].index_bytes_per_token_layer == 132


def test_deepseek_v3_on_8_h200_holds_its_weights_at_fp8_and_a_latent_copy_per_gpu(tmp_path):
    """Acceptance: the run's kv_slots by hand. Each H200 gives 141 GiB × 0.9 less 1 GiB of activations and
    holds 1/8 of the 671 B fp8 weights; the latent is replicated, so each GPU's KV memory holds whole
    tokens of 61 × 576 × 2 bytes."""
    per_gpu_bytes = (141 * 0.9 - 1.0) * GIB - 671e9 * 1 / 8
    expected = math.floor(per_gpu_bytes / (61 * (512 + 64) * 2))
    assert expected == 730_149
    cfg = RunConfig(model="deepseek-v3", gpu="h200", tp=8, kernel="none", workload="sharegpt-like",
                    num_requests=20, rate=5.0, strategy="contiguous-oracle")
    assert cfg.resolve().capacity_slots == expected
    summary = run(cfg, tmp_path / "v3")
    assert summary["kv_slots"] == expected
    assert summary["num_finished"] == 20


def test_tensor_parallelism_does_not_split_a_latent_row():
    """Per-head K/V: N GPUs pool their memory for the tokens' bytes. Latent: N GPUs hold N copies, so a
    token costs N × its bytes; 8 GPUs hold no more tokens than one GPU's memory after its weight share."""
    m, gpu = MODELS["deepseek-v2-lite"], GPUS["h100-sxm"]
    for tp in (1, 2, 4, 8):
        per_gpu = (80 * 0.9 - 1.0) * GIB - 15.7e9 * 2 / tp
        assert kv_capacity_slots(m, "fp16", gpu=gpu, num_gpus=tp) == math.floor(per_gpu / m.kv_bytes_per_token())
    assert RunConfig(model="deepseek-v2-lite", gpu="h100-sxm", tp=8).resolve().capacity_slots == math.floor(
        ((80 * 0.9 - 1.0) * GIB - 15.7e9 * 2 / 8) / 31_104)


def test_weight_dtype_sets_the_weights_capacity_subtracts():
    fp8 = RunConfig(model="llama-2-13b", gpu="a100-80gb", weight_dtype="fp8").resolve()
    fp16 = RunConfig(model="llama-2-13b", gpu="a100-80gb").resolve()
    per_token = MODELS["llama-2-13b"].kv_bytes_per_token("fp16")
    assert fp8.capacity_slots == math.floor(((80 * 0.9 - 1.0) * GIB - 13.0e9) / per_token)
    assert fp16.capacity_slots == math.floor(((80 * 0.9 - 1.0) * GIB - 26.0e9) / per_token)
    assert fp8.model.weight_bytes() == 13_000_000_000
    bf16 = RunConfig(model="deepseek-v2-lite", gpu="h200", weight_dtype="fp16").resolve()
    assert bf16.model.weight_dtype == "fp16" and MODELS["deepseek-v2-lite"].weight_dtype == "bf16"


def test_an_unknown_weight_dtype_is_refused():
    with pytest.raises(ValueError, match="weight_dtype: 'int4' is not one of fp16, bf16, fp8"):
        RunConfig(weight_dtype="int4")


def test_671b_at_16_bits_does_not_fit_8_h200():
    with pytest.raises(ValueError, match="leaves no KV memory on 8 × h200"):
        RunConfig(model="deepseek-v3", gpu="h200", tp=8, weight_dtype="bf16").resolve()


@pytest.mark.parametrize("name", sorted(n for n, m in MODELS.items() if m.is_moe))
def test_the_experts_fit_in_the_parameter_total(name):
    m = MODELS[name]
    experts = m.moe_layers * (m.num_experts + m.num_shared_experts) * m.expert_params
    rest = m.params_b * 1e9 - experts - m.embedding_params - m.mixer_params  # attention (and recurrent) layers
    # what is left is the dense layers' MLPs, routers and norms: under 0.5% of the total
    assert 0 <= rest < 0.005 * m.params_b * 1e9


def test_a_lower_max_model_len_caps_the_top_k_at_every_token():
    res = RunConfig(model="deepseek-v3.2", gpu="h200", tp=8, max_model_len=1024).resolve()
    assert res.model.index_topk == 1024 and MODELS["deepseek-v3.2"].index_topk == 2048


def test_a_custom_latent_geometry():
    m = model_from_name(SMALL_LATENT + ",index_heads=2,index_dim=128,index_topk=64")
    assert m.kv_layout == "latent" and m.num_kv_heads == 1
    assert m.kv_bytes_per_token("bf16") == 2 * ((32 + 16) * 2 + 128 + 4)


@pytest.mark.parametrize("argv,message", [
    (["--model", "deepseek-v2-lite", "--kernel-heads", "1"], "kernel_heads applies to per-head K/V"),
    (["--model", SMALL_LATENT + ",index_heads=2,index_dim=16"], "an indexer without index_topk"),
    (["--model", SMALL_LATENT + ",index_heads=2,index_dim=16,index_topk=0"], "an indexer without index_topk"),
    (["--model", SMALL_LATENT + ",index_heads=2,index_dim=16,index_topk=-3"], "index_topk must be >= 1, got -3"),
    (["--model", SMALL_LATENT + ",index_heads=2,index_dim=16,index_topk=513"],
     "index_topk (513) exceeds max_model_len (512)"),
    (["--model", "custom:layers=2,heads=4,kv_heads=4,head_dim=16,experts=64,experts_per_token=2,expert_width=4096,"
                 "params_b=0.1"], "2 MoE layers × (64 + 0) experts of width 4096 hold 0.1007 B parameters"),
    (["--model", "custom:layers=2,heads=4,kv_heads=4,head_dim=16,experts=4,experts_per_token=5,expert_width=16"],
     "experts_per_token must be in [1, num_experts = 4], got 5"),
])
def test_bad_latent_sparse_and_moe_input_exits_2_with_one_line(argv, message, capsys, tmp_path):
    out = tmp_path / "out"
    assert main([*argv, "--kv-gib", "1", "--kernel", "none", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not out.exists()
