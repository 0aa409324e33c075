"""Hybrid models in the engine: each layer group's kernel runs over its own table with its window,
checked against the float64 reference in the loop, and `--hybrid on` fits more sequences than off."""

from __future__ import annotations

import pytest

from tests.engine.conftest import simulate_checked, small_config
from workbench.allocators import registry
from workbench.allocators.paged.hybrid import HybridPaged
from workbench.config import RunConfig
from workbench.engine import simulation as engine


def _config(**kw) -> RunConfig:
    base = dict(strategy="paged", model="gpt-oss-20b", max_model_len=1024, kernel_heads=1, kernel="numba",
                workload="fixed:prompt=150,output=200", num_requests=6, rate=1000.0, block_size=16, seed=3)
    return RunConfig(**{**base, **kw})


def test_windowed_groups_verify_against_the_reference_every_step():
    """Prompts and outputs longer than gpt-oss's 128-token window: the window group releases blocks while
    the kernels keep matching the reference recomputed from the logical tokens."""
    summary = engine.run(_config(kv_slots=4000, verify_every=1))
    assert summary["verify_max_rel_err"] <= 1e-2
    assert summary["num_finished"] == 6


def test_hybrid_on_holds_more_sequences_than_off():
    cfg = dict(kv_slots=1200, kernel="none", num_requests=12, workload="fixed:prompt=300,output=400")
    on, off = engine.run(_config(hybrid="on", **cfg)), engine.run(_config(hybrid="off", **cfg))
    assert on["mean_batch_size"] > off["mean_batch_size"]
    assert on["num_preemptions"] <= off["num_preemptions"]


def test_the_pool_is_the_same_bytes_in_unit_slots():
    cfg = _config(kv_slots=1200)
    res = cfg.resolve()
    strategy = registry.create_from_config(cfg, res)
    assert isinstance(strategy, HybridPaged)
    assert strategy.capacity_slots == 2400  # gpt-oss-20b: 12 + 12 layers, a slot is 12 layers of one token
    cfg_off = _config(kv_slots=1200, hybrid="off")
    off = registry.create_from_config(cfg_off, cfg_off.resolve())
    assert not isinstance(off, HybridPaged) and off.capacity_slots == 1200


@pytest.mark.parametrize("name", [r.name for r in registry.registrations()
                                  if r.block_sized and r.name not in registry.hybrid_names()])
def test_a_prefix_index_without_a_hybrid_form_needs_hybrid_off(name):
    with pytest.raises(ValueError, match="--hybrid off"):
        engine.check_config(_config(strategy=name, kv_slots=4000))
    engine.check_config(_config(strategy=name, kv_slots=4000, hybrid="off"))


def _prefix_config(**kw) -> RunConfig:
    """Shared system prompts of 300 tokens: past gpt-oss's 128-token window, so a window group's hit holds
    only the blocks its first query reads."""
    return _config(**{**dict(strategy="paged-prefix", workload="system-prompt:k=2,system=300,lengths=alpaca",
                             num_requests=10, rate=4.0, kv_slots=4000), **kw})


@pytest.mark.parametrize("name", [r.name for r in registry.registrations()
                                  if r.prefix_cache and r.name in registry.hybrid_names()])
def test_prefix_hits_on_a_hybrid_pool_verify_against_the_reference(name):
    summary = engine.run(_prefix_config(strategy=name, verify_every=1))
    assert summary["prefix_hit_rate"] > 0.3
    assert summary["verify_max_rel_err"] <= 1e-2
    assert summary["num_finished"] == 10


def test_a_wrong_hit_length_fails_verification(monkeypatch):
    """Claiming one block more than the pool holds leaves that block's KV unwritten: the kernels read
    stale memory and the reference in the loop catches it."""
    from workbench.engine.runner import VerificationError

    admit = HybridPaged.admit

    def overclaim(self, seq_ids, spec):
        result = admit(self, seq_ids, spec)
        if result.cached_tokens:
            return result._replace(cached_tokens=result.cached_tokens + self.block_size)
        return result

    monkeypatch.setattr(HybridPaged, "admit", overclaim)
    with pytest.raises(VerificationError):
        engine.run(_prefix_config(verify_every=1))


def test_contiguous_baselines_reserve_every_layer():
    cfg = _config(strategy="contiguous-max", kv_slots=4000, kernel="none")
    assert not isinstance(registry.create_from_config(cfg, cfg.resolve()), HybridPaged)
    engine.run(cfg)


def test_steps_carry_each_group_and_the_identity_holds_per_step():
    from workbench.allocators.values import GROUP_PARTS
    from workbench.engine import simulate
    from workbench.workload import build_workload

    cfg = _config(kv_slots=1200, kernel="none", num_requests=8, workload="fixed:prompt=300,output=400")
    steps = simulate(cfg, build_workload(cfg), registry.create_from_config(cfg, cfg.resolve())).steps
    for i in range(2):
        parts = steps[[f"group{i}_{p}" for p in GROUP_PARTS]].to_numpy()  # [num_steps, 4]
        assert (parts[:, :3].sum(axis=1) == parts[:, 3]).all()
    held = steps["group0_held_slots"] + steps["group1_held_slots"]
    assert (held + steps["cached_slots"] + steps["free_slots"] == 2400).all()
    assert (steps["group0_token_slots"] + steps["group1_token_slots"] == steps["token_slots"]).all()
    assert steps["group0_held_slots"].max() < steps["group1_held_slots"].max()  # the window group holds less


def test_a_hybrid_run_writes_its_groups_to_config_json(tmp_path):
    import json

    engine.run(_config(kv_slots=1200, kernel="none", num_requests=2), tmp_path / "run")
    resolved = json.loads((tmp_path / "run" / "config.json").read_text())["resolved"]
    assert resolved["layer_groups"] == [[128, 1], [None, 1]]
    assert resolved["model"]["layer_groups"] == [{"num_layers": 12, "window_tokens": 128},
                                                 {"num_layers": 12, "window_tokens": None}]


def test_a_window_hit_missing_its_first_block_fails_verification(monkeypatch):
    """A window group holding one block fewer than its first query reads (an off-by-one in vLLM's rule)
    reads a placeholder block: the reference in the loop catches it."""
    from workbench.allocators.paged.hybrid_prefix import HybridPrefixCache
    from workbench.engine.runner import VerificationError

    find_hit = HybridPrefixCache.find_hit

    def short_window(self, keys, max_blocks):
        hit, held = find_hit(self, keys, max_blocks)
        return hit, [h[1:] if g.window_tokens else h for g, h in zip(self.groups, held, strict=True)]

    monkeypatch.setattr(HybridPrefixCache, "find_hit", short_window)
    with pytest.raises(VerificationError):
        engine.run(_prefix_config(verify_every=1))


def test_a_readmitted_beam_group_is_bounded_in_pool_blocks():
    """Beams recomputed after a preemption are readmitted only when the pool holds an upper bound of what the
    prompt and each beam's own tokens take, counted in pool blocks: one block of a sequence is a block in each
    of gpt-oss's two groups. Counted in blocks of a sequence, the bound let a readmission through whose appends
    then ran out of blocks."""
    cfg = small_config(strategy="paged", model="gpt-oss-20b", max_model_len=512, kernel_heads=1, block_size=1,
                       kv_slots=512, beam_width=2, workload="alpaca-like", seed=0, kernel="none", num_requests=15,
                       rate=50.0)
    result = simulate_checked(cfg)
    assert result.summary["num_preemptions"] > 0
    assert result.summary["num_finished"] + result.summary["num_rejected"] == 15


@pytest.mark.parametrize("n", [1, 2])
def test_the_unshared_slots_count_every_group_in_pool_units(n):
    """A step row's unshared slots are the held blocks counted once per holding sequence, over both groups in
    pool slots, and its logical slots their written slots so counted: with one sequence a request nothing is
    shared, so they are the allocated and the written slots at every step (both sharing savings 0: not the
    negative figure of one group's blocks against both groups' slots, nor the window's releases taken for
    sharing); samples sharing their prompt save blocks."""
    cfg = small_config(strategy="paged", model="gpt-oss-20b", max_model_len=512, kernel_heads=1, block_size=4,
                       kv_slots=4000, n=n, workload="alpaca-like", seed=0, kernel="none", num_requests=12, rate=50.0)
    result = simulate_checked(cfg)
    steps = result.steps
    allocated = steps["token_slots"] + steps["reserved_slots"] + steps["internal_frag_slots"]
    held = steps["group0_held_slots"] + steps["group1_held_slots"]
    assert (held == allocated).all()
    summary = result.summary
    if n == 1:
        assert (steps["unshared_block_slots"] == allocated).all()
        assert (steps["logical_token_slots"] == steps["token_slots"]).all()
        assert summary["block_sharing_saving_frac"] == 0.0 and summary["sharing_saving_frac"] == 0.0
    else:
        assert (steps["unshared_block_slots"] >= allocated).all() and (steps["unshared_block_slots"] > allocated).any()
        assert (steps["logical_token_slots"] >= steps["token_slots"]).all()
        assert 0.0 < summary["block_sharing_saving_frac"] < 1.0 and 0.0 < summary["sharing_saving_frac"] < 1.0



@pytest.mark.parametrize("strategy", ["paged", "paged-prefix"])
def test_the_watermark_counts_an_admission_in_pool_blocks(strategy):
    """Admission keeps the watermark's blocks back counted as the pool counts them: a prompt's block is a block in
    each of gpt-oss's two groups, so every step that admitted leaves at least the watermark's pool blocks
    allocatable (an admission takes at most the bound it was held to). Counted in blocks of a sequence, the
    bound let admissions through that left fewer (208 of the 225 here)."""
    cfg = small_config(strategy=strategy, model="gpt-oss-20b", max_model_len=512, kernel_heads=1, block_size=4,
                       kv_slots=1500, watermark_frac=0.3, workload="alpaca-like", seed=0, kernel="none",
                       num_requests=60, rate=2000.0)
    steps = simulate_checked(cfg).steps
    pool_slots = steps[["token_slots", "reserved_slots", "internal_frag_slots", "cached_slots", "free_slots",
                        "external_frag_slots"]].sum(axis=1)
    assert pool_slots.nunique() == 1  # the partition of the pool, in its own (unit) slots
    watermark_blocks = int(cfg.watermark_frac * (int(pool_slots.iloc[0]) // cfg.block_size))
    allocatable_blocks = (steps["free_slots"] + steps["cached_slots"]) // cfg.block_size
    admitted = steps["num_prefill_tokens"] > 0
    assert admitted.sum() > 5 and (steps["num_waiting"] > 0).sum() > 100
    assert (allocatable_blocks[admitted] >= watermark_blocks).all()
    assert allocatable_blocks[admitted].min() < watermark_blocks + 8  # the watermark binds


@pytest.mark.slow  # 5 s of verified kernels; the quick run takes this path in the readmitted beam test above
def test_readmitted_beams_keep_the_window_their_step_computes():
    """A beam group readmitted after a recompute appends each beam's own tokens in the step that recomputes its
    prompt; the window group releases none of the prompt's blocks before that step's kernel has written and read
    them (`append_recomputed`), and the kernels verify at every step. Released as a decode step releases, the
    step's prompt write found its first positions gone (`left the window and were released`)."""
    cfg = small_config(strategy="paged", model="gpt-oss-20b", max_model_len=512, kernel_heads=1, block_size=1,
                       kv_slots=512, beam_width=2, preemption="recompute", workload="sharegpt-like", seed=0,
                       schedule="fcfs", watermark_frac=0.0, num_requests=8)
    summary = simulate_checked(cfg).summary
    assert summary["num_preemptions"] > 0 and summary["verify_max_rel_err"] <= 1e-2
    assert summary["num_finished"] + summary["num_rejected"] == cfg.num_requests
