import re

import pytest

from workbench.presets import GPUS, MODELS, kv_capacity_slots, model_from_name


def test_opt13b_is_800kb_per_token():
    assert MODELS["opt-13b"].kv_bytes_per_token("fp16") == 819_200


def test_12gib_of_opt13b_holds_15728_slots():
    assert kv_capacity_slots(MODELS["opt-13b"], "fp16", kv_gib=12) == 15_728


def test_llama3_8b_gqa_bytes_per_token():
    assert MODELS["llama-3-8b"].kv_bytes_per_token("fp16") == 131_072


@pytest.mark.parametrize("name", sorted(n for n, m in MODELS.items() if m.kv_layout == "heads"))
@pytest.mark.parametrize("dtype,nbytes", [("fp32", 4), ("fp16", 2), ("bf16", 2), ("fp8", 1)])
def test_every_preset_matches_the_formula(name, dtype, nbytes):
    m = MODELS[name]
    assert m.kv_bytes_per_token(dtype) == 2 * m.attention_layers * m.num_kv_heads * m.head_dim * nbytes


# per sequence: (conv bytes, recurrent-matrix bytes) over every recurrent layer, from each config.json's dims
# (conv: (kernel - 1) × (value heads × d_v + 2 × key heads × d_k) at bf16; matrices: heads × d_v × d_k at the
# state dtype), and the attention layers that hold KV
RECURRENT_PRESETS = {
    "qwen3-next-80b-a3b": (36 * 3 * (32 * 128 + 2 * 16 * 128) * 2, 36 * 32 * 128 * 128 * 2, 12),
    "qwen3.5-27b": (48 * 3 * (48 * 128 + 2 * 16 * 128) * 2, 48 * 48 * 128 * 128 * 4, 16),
    "nemotron-h-8b": (24 * 3 * (128 * 64 + 2 * 8 * 128) * 2, 24 * 128 * 64 * 128 * 4, 4),
    "qwen3.5-0.8b": (18 * 3 * (16 * 128 + 2 * 16 * 128) * 2, 18 * 16 * 128 * 128 * 4, 6),
}


@pytest.mark.parametrize("name", RECURRENT_PRESETS)
def test_a_recurrent_preset_holds_its_config_state(name):
    conv, matrices, attention = RECURRENT_PRESETS[name]
    m = MODELS[name]
    assert (m.state_bytes_per_seq(), m.attention_layers) == (conv + matrices, attention)
    assert m.kv_bytes_per_token("fp16") == 2 * attention * m.num_kv_heads * m.head_dim * 2


def test_qwen3_next_state_is_1608_tokens_of_its_kv():
    m = MODELS["qwen3-next-80b-a3b"]
    assert m.state_bytes_per_seq() == 39_518_208 and m.state_bytes_per_seq() / m.kv_bytes_per_token("bf16") == 1608


def test_capacity_derived_from_gpu_subtracts_weights():
    m, g = MODELS["opt-13b"], GPUS["a100-40gb"]
    slots = kv_capacity_slots(m, "fp16", gpu=g)
    expected_bytes = (40 * 0.9 - 1.0) * 2**30 - 12.85e9 * 2
    assert slots == int(expected_bytes // 819_200)


def test_model_that_does_not_fit_is_an_error():
    with pytest.raises(ValueError, match="leaves no KV memory"):
        kv_capacity_slots(MODELS["opt-175b"], gpu=GPUS["a100-80gb"])


def test_custom_geometry():
    m = model_from_name("custom:layers=2,kv_heads=4,heads=8,head_dim=64,max_model_len=512")
    assert m.kv_bytes_per_token("fp32") == 2 * 2 * 4 * 64 * 4
    assert m.max_model_len == 512


@pytest.mark.parametrize("spec", ["custom:layers=2", "custom:layers=x,kv_heads=1,head_dim=8",
                                  "custom:layers=2,kv_heads=3,heads=8,head_dim=8", "gpt-9"])
def test_bad_model_names_are_clear_errors(spec):
    with pytest.raises(ValueError):
        model_from_name(spec)


HYBRID = ["gpt-oss-20b", "gpt-oss-120b", "gemma-3-27b", "gemma-2-9b", "mistral-7b-v0.1"]


@pytest.mark.parametrize("name", HYBRID)
def test_hybrid_groups_add_up_to_the_model(name):
    m = MODELS[name]
    assert m.is_hybrid
    assert sum(g.num_layers for g in m.groups()) == m.num_layers
    assert sum(m.group_kv_bytes_per_token(g, "bf16") for g in m.groups()) == m.kv_bytes_per_token("bf16")
    assert all(g.num_layers % m.unit_layers() == 0 for g in m.groups())
    off = m.groups(hybrid=False)
    assert len(off) == 1 and off[0].window_tokens is None and off[0].num_layers == m.num_layers


def test_hybrid_geometries_from_the_public_configs():
    # (layers, kv_heads, head_dim, {window: layers}) as in the models' config.json
    expected = {"gpt-oss-20b": (24, 8, 64, {128: 12, None: 12}),
                "gpt-oss-120b": (36, 8, 64, {128: 18, None: 18}),
                "gemma-3-27b": (62, 16, 128, {1024: 52, None: 10}),
                "gemma-2-9b": (42, 8, 256, {4096: 21, None: 21}),
                "mistral-7b-v0.1": (32, 8, 128, {4096: 32})}
    for name, (layers, kv_heads, head_dim, groups) in expected.items():
        m = MODELS[name]
        assert (m.num_layers, m.num_kv_heads, m.head_dim) == (layers, kv_heads, head_dim)
        assert {g.window_tokens: g.num_layers for g in m.groups()} == groups


def test_non_hybrid_presets_have_one_full_group():
    m = MODELS["llama-3-8b"]
    assert not m.is_hybrid and m.groups() == m.groups(hybrid=False)
    assert m.unit_layers() == m.num_layers


def test_layer_groups_must_cover_the_model():
    from workbench.presets import LayerGroup, ModelPreset
    with pytest.raises(ValueError, match="layer groups hold"):
        ModelPreset("bad", 4, 4, 4, 8, 1.0, 64, (LayerGroup(2, 8), LayerGroup(1)))


@pytest.mark.parametrize("spec,message", [
    ("custom:layers=2,kv_heads=2,head_dim=16,params_b=inf", "params_b must be a finite number, got 'inf'"),
    ("custom:layers=2,kv_heads=2,head_dim=16,params_b=1e300", "params_b must be <= 1000000.0"),
    ("custom:layers=1e30,kv_heads=2,head_dim=16", "num_layers must be <= 65536"),
    ("custom:layers=2,kv_heads=2,head_dim=nan", "head_dim must be a finite number"),
])
def test_custom_models_are_finite_and_bounded(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        model_from_name(spec)
