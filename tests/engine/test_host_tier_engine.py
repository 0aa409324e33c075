"""A prefix cache's host tier in the engine: evicted prefixes are demoted, promoted on a later hit and
read by the kernels, verified against the reference in the loop; its clock charge; its outputs."""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.conftest import replace, simulate_checked, small_config
from tests.engine.golden import table_hash
from workbench.allocators import registry
from workbench.clock.roofline import RooflineClock
from workbench.clock.step_cost import StepCost
from workbench.engine.kvpool import KVPool
from workbench.engine.runner import VerificationError
from workbench.presets import GPUS, model_from_name

HOST_TIERED = [r.name for r in registry.registrations() if "host_cache_gib" in r.options]
# four tenants' 160-token system prompts do not all fit beside the running requests in 512 slots: they
# are evicted, and come back from the host tier (SMALL_MODEL in fp32 is 512 bytes per token: 1 MiB
# holds 2,048 tokens)
TENANTS = dict(workload="system-prompt:k=4,system=160,lengths=alpaca", num_requests=16, kv_slots=512, rate=8.0)
HOST_GIB = 2**-10


@pytest.fixture(scope="module", params=HOST_TIERED)
def tiered_runs(request):
    base = small_config(strategy=request.param, **TENANTS)
    return simulate_checked(base), simulate_checked(replace(base, host_cache_gib=HOST_GIB))


def test_promoted_prefixes_pass_verification_and_only_add_hits(tiered_runs):
    """Every step verified (decode and extend against the float64 reference): the promoted blocks hold
    the right KV. A promote replaces a recompute, so the device's own hits stay as they were."""
    off, on = tiered_runs
    s_off, s_on = off.summary, on.summary
    assert s_on["num_finished"] == s_off["num_finished"] == 16
    assert s_on["prefix_hit_rate_host"] > 0.05 and s_off["prefix_hit_rate_host"] == 0
    assert s_on["prefix_hit_rate"] == s_off["prefix_hit_rate"]
    block_bytes = model_from_name(small_config().model).kv_bytes_per_token("fp32") * 8
    assert s_on["host_bytes_loaded"] % block_bytes == 0
    assert s_on["host_bytes_loaded"] / block_bytes * 8 == pytest.approx(
        s_on["prefix_hit_rate_host"] * s_on["prefix_query_tokens"])
    assert s_on["host_bytes_demoted"] >= s_on["host_bytes_loaded"] > 0
    assert s_off["host_bytes_loaded"] == s_off["host_bytes_demoted"] == 0
    # each request's hit counts both tiers
    assert on.requests["prefix_hit_tokens"].sum() > off.requests["prefix_hit_tokens"].sum()


def test_host_columns_keep_their_identity_and_appear_only_with_a_tier(tiered_runs):
    off, on = tiered_runs
    assert "host_token_slots" not in off.steps and "host_free_slots" not in off.steps
    capacity = int(HOST_GIB * 2**30) // 512
    host = on.steps["host_token_slots"].to_numpy() + on.steps["host_free_slots"].to_numpy()
    assert (host == capacity).all() and on.steps["host_token_slots"].max() > 0
    # the device's six-way identity is unchanged
    slots = on.steps[["token_slots", "reserved_slots", "internal_frag_slots", "cached_slots", "external_frag_slots",
                      "free_slots"]].sum(axis=1)
    assert (slots == 512).all()


def test_a_corrupted_host_copy_fails_verification(monkeypatch):
    """The check has teeth: perturb what a demote writes into the host tier, and the kernel output of a
    request whose prefix is promoted from it differs from the reference."""
    demote = KVPool.demote

    def corrupting(self, moves, block_size):
        demote(self, moves, block_size)
        rows = (moves[:, 1:2].astype(np.int64) * block_size + np.arange(block_size)).ravel()
        self.tier_k[rows] += 0.25

    monkeypatch.setattr(KVPool, "demote", corrupting)
    with pytest.raises(VerificationError, match="differs from the reference"):
        simulate_checked(small_config(strategy=HOST_TIERED[0], host_cache_gib=HOST_GIB, **TENANTS))


def test_same_config_gives_identical_tables():
    cfg = small_config(strategy=HOST_TIERED[0], host_cache_gib=HOST_GIB, kernel="none", **TENANTS)
    a, b = simulate_checked(cfg), simulate_checked(cfg)
    assert table_hash(a.steps) == table_hash(b.steps) and table_hash(a.requests) == table_hash(b.requests)
    assert a.summary["host_bytes_loaded"] > 0


# the datasheet link (one direction) at the 25/32 that pinned copies reach on PCIe 4.0 x16
@pytest.mark.parametrize("gpu,link_gb_s", [("a100-40gb", 25.0), ("a100-80gb", 25.0), ("h100-sxm", 50.0),
                                           ("h200", 50.0)])
def test_a_promote_costs_its_bytes_over_the_host_link_added_or_overlapped(gpu, link_gb_s):
    model = model_from_name("llama-3-8b")
    kv_bytes_per_token, block_size, loaded = model.kv_bytes_per_token("fp16"), 16, 100
    load_s = loaded * kv_bytes_per_token * block_size / (link_gb_s * 1e9)

    def clock(overlap_load: bool) -> RooflineClock:
        return RooflineClock(model, GPUS[gpu], kv_bytes_per_token, block_size, eff_bw=0.8, eff_flops=0.75,
                             step_overhead_s=1e-3, overlap_load=overlap_load)

    work = StepCost(num_prefill_tokens=512, num_decode_tokens=8, kv_read_tokens=9000, attn_query_ctx=200_000,
                    decode_ctx_tokens=8000, unshared_block_slots=0, num_running=9, copied_blocks=0, swapped_blocks=0)
    step_s = clock(False).cost_s(work)
    assert clock(True).cost_s(work) == step_s  # nothing loaded: no charge either way
    assert clock(False).cost_s(work._replace(loaded_blocks=loaded)) == pytest.approx(step_s + load_s, rel=1e-12)
    assert clock(True).cost_s(work._replace(loaded_blocks=loaded)) == pytest.approx(max(step_s, load_s), rel=1e-12)
    many = work._replace(loaded_blocks=100 * loaded)  # a load longer than the step shows through
    assert clock(True).cost_s(many) == pytest.approx(100 * load_s, rel=1e-12) and 100 * load_s > step_s
