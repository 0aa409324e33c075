"""The randomized runs of test_random_configs on the other model layouts: recurrent state beside attention
(Gated DeltaNet), a latent KV with top-k sparse attention (MLA with DeepSeek's indexer) and sliding-window
layers beside full ones (gpt-oss). A strategy that does not serve a layout refuses it before the run."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.engine.test_random_configs import CONFIGS, check_random_config, random_config
from workbench.allocators import registry

MODELS = {
    "recurrent": dict(model="custom:layers=4,kv_heads=2,heads=4,head_dim=16,params_b=0.1,max_model_len=512,"
                            "state_layers=2,state_heads=4,state_head_dim=16,state_dim=16,state_groups=2,conv_kernel=4"),
    "latent-sparse": dict(model="custom:layers=2,heads=4,head_dim=32,kv_lora=512,rope_dim=64,index_heads=2,"
                                "index_dim=128,index_topk=24,params_b=0.05,max_model_len=512"),
    "sliding-window": dict(model="gpt-oss-20b", max_model_len=512, kernel_heads=1),
}
MODEL_CONFIGS = st.fixed_dictionaries({**CONFIGS, "layout": st.sampled_from(sorted(MODELS))})


def _refused(cfg) -> bool:
    """Whether the run is refused before any work: a layout the strategy does not serve, or an option the layout
    has not built (swap preemption of a recurrent state, chunked prefill on a pool of layer groups, ...)."""
    try:
        registry.check_strategy(cfg, cfg.resolve())
    except ValueError:
        return True
    return False


def check(drawn: dict, kernel: str = "none") -> None:
    """`drawn`: test_random_configs' fields and the layout."""
    fields = {**{k: v for k, v in drawn.items() if k != "layout"}, "kernel": kernel, **MODELS[drawn["layout"]]}
    assume(not _refused(random_config(**fields)))
    check_random_config(**fields)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(MODEL_CONFIGS)
def test_random_layouts_keep_every_invariant(drawn):
    check(drawn)


@pytest.mark.slow
@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(MODEL_CONFIGS)
def test_more_random_layouts_keep_every_invariant(drawn):
    check(drawn)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(MODEL_CONFIGS)
def test_random_layouts_with_verified_kernels(drawn):
    check(drawn, kernel="numba")
