"""Speculative decoding (workbench.engine.speculation, docs/speculative.md): draft slots taken and rolled back
block by block, a prefix cache that never registers a draft token, the accounting every step for every
strategy, the verify step's cost, determinism and bad input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.engine.conftest import SMALL_MODEL as SMALL_MODEL_ARG
from tests.engine.conftest import checked_strategy, replace, small_config
from workbench.allocators import registry
from workbench.allocators.prefix.keys import block_keys
from workbench.allocators.values import SeqSpec
from workbench.clock.step_cost import StepCost, with_drafts
from workbench.config import RunConfig
from workbench.engine import simulate
from workbench.engine.speculation import Speculation
from workbench.workload import build_workload

BLOCK = 16
DRAFTING = [name for name in registry.names()
            if registry.create(name, capacity_slots=4096, block_size=BLOCK, max_model_len=512).supports_drafts]
PREFIX = [name for name in DRAFTING if registry.get(name).prefix_tree or name == "paged-prefix"]


def _strategy(name: str, capacity_slots: int = 4096):
    return registry.create(name, capacity_slots=capacity_slots, block_size=BLOCK, max_model_len=512)


def _table(strategy, seq_id: int) -> list[int]:
    d = strategy.describe([seq_id])
    return d.kv_indices.tolist()


def test_every_registered_strategy_drafts():
    assert DRAFTING == registry.names()


@pytest.mark.parametrize("name", ["paged", "paged-prefix", "radix"])
def test_three_drafts_one_accepted_across_the_block_boundary(name):
    """A 14-token prompt (block 0 holds 14 of 16). The step writes the last token at 14 and drafts at 15, 16,
    17: block 0 fills and a block 1 is taken for 16 and 17. One draft is accepted: the sequence holds 16
    tokens, block 1 is empty again and returns to the pool."""
    s = _strategy(name)
    prompt = np.arange(1, 15, dtype=np.int32)
    assert s.admit([0], SeqSpec(prompt, 40)).admitted
    free_before = s.num_allocatable_blocks()
    assert _table(s, 0) == [s.describe([0]).kv_indices[0]]
    appended = s.append_with_drafts([0], np.array([500], dtype=np.int32), np.array([3]))
    assert appended is not None and appended.slots.shape == (1,)
    table = _table(s, 0)
    assert len(table) == 2 and s.num_allocatable_blocks() == free_before - 1
    assert s.snapshot().token_slots == 18
    s.check_integrity()
    s.settle_drafts([0], np.array([3]), np.array([1]), np.array([501], dtype=np.int32))
    s.check_integrity()
    assert _table(s, 0) == table[:1]
    assert s.num_allocatable_blocks() == free_before
    assert s.snapshot().token_slots == 16 and s.slot_mapping(0, 0, 16).shape == (16,)


@pytest.mark.parametrize("name", PREFIX)
def test_a_prefix_cache_registers_the_verified_tokens_only(name):
    """Block 0 fills with the prompt, the last token and an accepted draft: it is registered under the key of
    those verified tokens. A rejected draft that filled a block leaves nothing registered."""
    s = _strategy(name)
    prompt = np.arange(1, 15, dtype=np.int32)
    assert s.admit([0], SeqSpec(prompt, 60)).admitted
    s.append_with_drafts([0], np.array([500], dtype=np.int32), np.array([3]))
    assert s.registered_block_ids().shape[0] == 0  # block 0 is full of drafts, not verified yet
    s.settle_drafts([0], np.array([3]), np.array([1]), np.array([501], dtype=np.int32))
    verified = np.concatenate([prompt, [500, 501]]).astype(np.int32)
    assert s.registered_block_ids().tolist() == _table(s, 0)[:1]
    other = registry.create(name, capacity_slots=4096, block_size=BLOCK, max_model_len=512)
    # a second prompt of the same 16 verified tokens and one more hits the block
    s.free(0)
    probe = np.concatenate([verified, [7]]).astype(np.int32)
    assert s.admit([1], SeqSpec(probe, 40)).cached_tokens == 16
    del other
    # now a block filled by drafts that are all rejected
    s2 = _strategy(name)
    assert s2.admit([0], SeqSpec(np.arange(1, 13, dtype=np.int32), 60)).admitted
    s2.append_with_drafts([0], np.array([500], dtype=np.int32), np.array([4]))  # positions 12 .. 16
    s2.settle_drafts([0], np.array([4]), np.array([0]), np.zeros(0, dtype=np.int32))
    s2.check_integrity()
    assert s2.registered_block_ids().shape[0] == 0 and s2.snapshot().token_slots == 13


@pytest.mark.parametrize("name", PREFIX)
def test_random_drafts_leave_the_index_keyed_by_the_logical_tokens(name):
    """A random walk of several sequences drafting and settling: after every settle each sequence's full blocks
    are exactly the index's hits for the keys of its logical (verified) tokens."""
    rng = np.random.default_rng(7)
    s = _strategy(name, capacity_slots=8192)
    tokens: dict[int, list[int]] = {}
    final = 300
    for seq_id in range(6):
        prompt = rng.integers(1, 50, size=int(rng.integers(1, 40))).astype(np.int32)
        assert s.admit([seq_id], SeqSpec(prompt, final)).admitted
        tokens[seq_id] = prompt.tolist()
    for _ in range(40):
        ids = [i for i in tokens if len(tokens[i]) + 1 + 5 <= final]
        last = rng.integers(1, 50, size=len(ids)).astype(np.int32)
        drafts = rng.integers(0, 6, size=len(ids))
        assert s.append_with_drafts(ids, last, drafts) is not None
        s.check_integrity()
        accepted = np.minimum(rng.integers(0, 6, size=len(ids)), drafts)
        verified = rng.integers(1, 50, size=int(accepted.sum())).astype(np.int32)
        s.settle_drafts(ids, drafts, accepted, verified)
        s.check_integrity()
        at = 0
        for i, seq_id in enumerate(ids):
            tokens[seq_id] += [int(last[i]), *verified[at:at + accepted[i]].tolist()]
            at += int(accepted[i])
        for seq_id, held in tokens.items():
            full = len(held) // BLOCK
            hits = s.prefix.lookup(block_keys(np.array(held, dtype=np.int32), BLOCK), full)
            assert hits.tolist() == _table(s, seq_id)[:full]


def test_a_failed_round_gives_everything_back():
    """The default verbs: when a draft round finds no room the step's slots are given back (and the pages mapped
    for them unmapped, page reuse being off)."""
    s = registry.create("virtual-contiguous", capacity_slots=600, block_size=BLOCK, max_model_len=512, page_kib=64,
                        max_batch=4)
    assert s.admit([1], SeqSpec(np.arange(1, 401, dtype=np.int32), 500)).admitted
    assert s.admit([0], SeqSpec(np.arange(1, 10, dtype=np.int32), 500)).admitted
    before = s.snapshot()
    assert s.append_with_drafts([0], None, np.array([480])) is None
    after = s.snapshot()
    assert (after.token_slots, after.logical_token_slots) == (before.token_slots, before.logical_token_slots)
    assert s.describe([0]).kv_len.tolist() == [9]
    assert after.free_slots == before.free_slots
    s.check_integrity()


def test_acceptance_follows_alpha_and_is_seeded():
    spec = Speculation(3, 0.7, seed=5)
    n = 40_000
    req = np.arange(n, dtype=np.int64)
    gen = np.full(n, 4, dtype=np.int64)
    a = spec.accepted(req, gen, np.full(n, 3, dtype=np.int64))
    # E[min(Geometric, 3)] = 0.7 + 0.49 + 0.343; the mean of 40k draws has a standard error of ~0.0055
    assert abs(a.mean() - 1.533) < 0.03
    assert np.array_equal(a, Speculation(3, 0.7, seed=5).accepted(req, gen, np.full(n, 3, dtype=np.int64)))
    assert not np.array_equal(a, Speculation(3, 0.7, seed=6).accepted(req, gen, np.full(n, 3, dtype=np.int64)))
    assert np.array_equal(Speculation(3, 1.0, seed=5).accepted(req, gen, np.full(n, 2, dtype=np.int64)),
                          np.full(n, 2))
    assert spec.drafts(np.array([1, 2, 4, 9])).tolist() == [0, 1, 3, 3]


def test_steps_to_finish_is_the_walk_of_accepted_drafts():
    spec = Speculation(4, 0.6, seed=1)
    generated, steps = 1, 0
    while generated < 50:
        left = np.array([50 - generated])
        d = spec.drafts(left)
        generated += int(spec.accepted(np.array([3]), np.array([generated]), d)[0]) + 1
        steps += 1
    assert generated == 50 and spec.steps_to_finish(3, 1, 50) == steps
    assert Speculation(4, 1.0, seed=1).steps_to_finish(0, 1, 50) == 10  # 49 tokens, 5 a step


def test_the_verify_step_costs_its_queries_and_drafts():
    base = StepCost(0, 2, 22.0, 22.0, 22.0, 32, 2, 0, 0, decode_blocks=2, sampled_tokens=2)
    ctx, drafts = np.array([10, 12]), np.array([3, 0])
    cost = with_drafts(base, ctx, drafts, block_size=16, draft_model=True)
    assert cost.num_decode_tokens == 5 and cost.sampled_tokens == 5 and cost.kv_read_tokens == 25.0
    assert cost.attn_query_ctx == 22.0 + 11 + 12 + 13  # the drafts' queries attend 11, 12 and 13 keys
    assert cost.decode_blocks == 2 and (cost.draft_passes, cost.draft_rows, cost.draft_ctx_tokens) == (3, 1, 10)
    assert with_drafts(base, ctx, drafts, 16, draft_model=False).draft_passes == 0
    assert with_drafts(base, ctx, np.array([7, 0]), 16, True).decode_blocks == 3  # 17 rows: a second block


def _spec_config(strategy: str, **changes) -> RunConfig:
    cfg = small_config(strategy=strategy, kernel="none", num_requests=40, rate=200.0, kv_slots=1024, spec_tokens=3,
                       spec_accept=0.6)
    return replace(cfg, **changes)


@pytest.mark.parametrize("name", DRAFTING)
def test_every_strategy_keeps_its_accounting_while_drafting(name):
    cfg = _spec_config(name)
    strategy = checked_strategy(cfg)
    base = type(strategy)

    class Walked(base):
        def append_with_drafts(self, seq_ids, token_ids, num_drafts):
            before = self.snapshot().logical_token_slots
            out = super().append_with_drafts(seq_ids, token_ids, num_drafts)
            self.check_integrity()
            if out is not None:
                assert self.snapshot().logical_token_slots == before + len(seq_ids) + int(num_drafts.sum())
            return out

        def settle_drafts(self, seq_ids, num_drafts, accepted, token_ids):
            before = self.snapshot().logical_token_slots
            super().settle_drafts(seq_ids, num_drafts, accepted, token_ids)
            self.check_integrity()
            assert self.snapshot().logical_token_slots == before - int((num_drafts - accepted).sum())

    strategy.__class__ = Walked
    result = simulate(cfg, build_workload(cfg), strategy)
    strategy.check_integrity()
    steps, requests = result.steps, result.requests
    assert (requests["status"] == "finished").sum() + requests["status"].str.startswith("rejected").sum() == 40
    assert (steps["accepted_tokens"] + steps["rolled_back_slots"] == steps["draft_slots"]).all()
    assert steps["draft_slots"].sum() > 0 and steps["accepted_tokens"].sum() > 0
    # every decode row is one sequence's last token or one of its drafts
    assert steps["num_decode_tokens"].sum() >= steps["draft_slots"].sum()


def _run(cfg: RunConfig):
    return simulate(cfg, build_workload(cfg), registry.create_from_config(cfg, cfg.resolve()))


def test_same_seed_same_run_and_fewer_steps_than_without():
    cfg = _spec_config("paged")
    a, b = _run(cfg), _run(cfg)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    plain = _run(replace(cfg, spec_tokens=0))
    assert len(a.steps) < len(plain.steps)
    finished = a.requests["status"] == "finished"
    assert finished.all() and (plain.requests["status"] == "finished").all()
    assert "draft_slots" not in plain.steps  # k = 0: the tables of a run without speculation
    assert "accepted_tokens" not in plain.requests and "spec_accept_rate" not in plain.summary
    # the request column, the step column and the summary count the same accepted drafts
    accepted = int(a.steps["accepted_tokens"].sum())
    assert int(a.requests["accepted_tokens"].sum()) == accepted == a.summary["spec_accepted_tokens"]
    assert a.summary["spec_draft_tokens"] == int(a.steps["draft_slots"].sum())
    verified = int((a.steps["num_decode_tokens"] - a.steps["draft_slots"]).sum())
    assert a.summary["spec_verified_steps"] == verified
    assert a.summary["spec_tokens_per_step"] == 1.0 + accepted / verified
    dt = a.steps["dt_s"].to_numpy()
    weighted = (a.steps["draft_slots"].to_numpy().astype(np.float64) * dt).sum() / dt.sum()
    assert a.summary["mem_draft_frac"] == weighted / a.summary["kv_slots"] > 0
    # each request generated its first token at its prefill and a + 1 at each verify step
    assert (a.requests["accepted_tokens"] <= a.requests["output_tokens"] - 1).all()


@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16", "bf16", "fp8"])
@pytest.mark.parametrize("name", ["paged", "contiguous-oracle"])
def test_the_verify_step_kernel_matches_the_reference(name, kv_dtype):
    """Every step's verify attention (each sequence's last token and drafts as queries over its KV, the
    extend kernel) is checked against the float64 reference rebuilt from the logical tokens: a mismatch
    raises VerificationError. The largest error seen stays within the dtype's bound, and is nonzero:
    something was verified."""
    cfg = _spec_config(name, kernel="numba", kv_dtype=kv_dtype, verify_every=1, num_requests=12)
    result = _run(cfg)
    assert (result.requests["status"] == "finished").all() and result.steps["draft_slots"].sum() > 0
    assert 0 < result.summary["verify_max_rel_err"] <= (1e-5 if kv_dtype == "fp32" else 1e-2)


def test_an_eagle_draft_layer_takes_its_share_of_the_pool():
    cfg = RunConfig(model="llama-3-8b", kv_gib=10.0, kernel="none", spec_tokens=3)
    plain = RunConfig(model="llama-3-8b", kv_gib=10.0, kernel="none")
    layers = cfg.resolve().model.num_layers
    assert cfg.resolve().capacity_slots == plain.resolve().capacity_slots * layers // (layers + 1)
    assert replace(cfg, spec_method="ngram").resolve().capacity_slots == plain.resolve().capacity_slots


@pytest.mark.parametrize("changes, words", [
    ({"spec_tokens": 17}, "spec_tokens must be <= 16"),
    ({"spec_tokens": -1}, "spec_tokens must be >= 0"),
    ({"spec_tokens": 2, "spec_accept": 0.0}, "spec_accept must be > 0"),
    ({"spec_tokens": 2, "spec_accept": 1.5}, "spec_accept must be <= 1"),
    ({"spec_tokens": 2, "n": 2}, "n > 1"),
    ({"spec_tokens": 2, "kernel": "numba", "model": "deepseek-v2-lite", "kv_gib": 1.0}, "latent row"),
])
def test_bad_speculation_is_one_line(changes, words):
    with pytest.raises(ValueError, match=words):
        RunConfig(**{"kernel": "none", **changes}).resolve()


def test_window_and_sparse_models_refuse_speculation():
    for model in ("gpt-oss-20b", "deepseek-v3.2"):
        with pytest.raises(ValueError, match="built for full attention"):
            RunConfig(model=model, kernel="none", spec_tokens=2, kv_gib=1.0).resolve()


def _lengths_file(path, accepted: list[int]) -> str:
    rows = [f"{40 + 7 * i},{30 + 5 * i},{a}" for i, a in enumerate(accepted)]
    path.write_text("input_tokens,output_tokens,accepted\n" + "\n".join(rows) + "\n")
    return f"lengths:{path}"


@pytest.mark.parametrize("given, rate", [(3, 1.0), (0, 0.0)])
def test_a_trace_column_gives_each_request_its_accepted_length(tmp_path, given, rate):
    """`accepted` = K: every draft is kept; 0: every draft is rolled back and a step yields one token."""
    workload = _lengths_file(tmp_path / "lengths.csv", [given] * 20)
    cfg = _spec_config("paged", workload=workload, num_requests=20, spec_accept=0.5)
    result = _run(cfg)
    assert result.summary["spec_accept_rate"] == rate and result.summary["spec_draft_tokens"] > 0
    assert (result.steps["accepted_tokens"].sum() == 0) == (given == 0)
    if given == 0:
        assert result.summary["spec_tokens_per_step"] == 1.0


def test_a_trace_column_past_k_is_refused_before_the_run(tmp_path):
    from workbench.run import main

    workload = _lengths_file(tmp_path / "lengths.csv", [1, 1, 5, 1])
    out = tmp_path / "out"
    argv = ["--model", SMALL_MODEL_ARG, "--kv-slots", "1024", "--workload", workload, "--kernel", "none",
            "--spec-tokens", "3", "--rate", "10", "--out", str(out)]
    assert main(argv) == 2 and not out.exists()
    argv[argv.index("--spec-tokens") + 1] = "5"
    assert main(argv) == 0 and (out / "summary.json").is_file()


@pytest.mark.parametrize("fleet", [{"replicas": 2}, {"prefill_replicas": 1, "decode_replicas": 1}])
def test_a_fleet_drafts_on_each_replica_and_sums_the_counters(fleet):
    """Colocated replicas, and disaggregated prefill/decode (the decode replica drafts for shipped prompts):
    every request finishes and the summary's counters are the replicas' step columns summed."""
    from workbench.engine.simulation import run_in_memory

    result, _ = run_in_memory(_spec_config("paged-prefix", workload="system-prompt:k=2,system=64", **fleet))
    # a fleet's tables: a replica column, or a disaggregated run's prefill replica
    assert {"replica", "prefill_replica"} & set(result.requests) and (result.requests["status"] == "finished").all()
    assert result.summary["spec_draft_tokens"] == int(result.steps["draft_slots"].sum()) > 0
    assert result.summary["spec_accepted_tokens"] == int(result.steps["accepted_tokens"].sum())
