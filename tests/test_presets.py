import re

import pytest

from workbench.presets import GPUS, MODELS, kv_capacity_slots, model_from_name


def test_opt13b_is_800kb_per_token():
    assert MODELS["opt-13b"].kv_bytes_per_token("fp16") == 819_200


def test_12gib_of_opt13b_holds_15728_slots():
    assert kv_capacity_slots(MODELS["opt-13b"], "fp16", kv_gib=12) == 15_728


def test_llama3_8b_gqa_bytes_per_token():
    assert MODELS["llama-3-8b"].kv_bytes_per_token("fp16") == 131_072


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("dtype,nbytes", [("fp32", 4), ("fp16", 2), ("bf16", 2), ("fp8", 1)])
def test_every_preset_matches_the_formula(name, dtype, nbytes):
    m = MODELS[name]
    assert m.kv_bytes_per_token(dtype) == 2 * m.num_layers * m.num_kv_heads * m.head_dim * nbytes


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


@pytest.mark.parametrize("spec,message", [
    ("custom:layers=2,kv_heads=2,head_dim=16,params_b=inf", "params_b must be a finite number, got 'inf'"),
    ("custom:layers=2,kv_heads=2,head_dim=16,params_b=1e300", "params_b must be <= 1000000.0"),
    ("custom:layers=1e30,kv_heads=2,head_dim=16", "num_layers must be <= 65536"),
    ("custom:layers=2,kv_heads=2,head_dim=nan", "head_dim must be a finite number"),
])
def test_custom_models_are_finite_and_bounded(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        model_from_name(spec)
