"""Runs of a model with recurrent layers (docs/recurrent.md): the accounting identity with the state classes at
every step for every strategy that holds state and every checkpoint policy, the anchors' hit rates, the clock's
state terms, and bad input refused before any work."""

from __future__ import annotations

import dataclasses

import pytest

from tests.engine.conftest import simulate_checked, small_config
from workbench import columns as C
from workbench.allocators import registry
from workbench.allocators.state.policies import POLICIES
from workbench.engine.simulation import run_in_memory
from workbench.presets import model_from_name

# two attention and two Gated DeltaNet layers of the small engine geometry: a state of 2 × 2,816 B per sequence
# (conv 3 × 128 channels and 4 heads of 16 × 16, bf16)
STATE_MODEL = ("custom:layers=4,kv_heads=2,heads=4,head_dim=16,params_b=0.1,max_model_len=512,state_layers=2,"
               "state_heads=4,state_head_dim=16,state_dim=16,state_groups=2,conv_kernel=4")
ATTENTION_TWIN = "custom:layers=4,kv_heads=2,heads=4,head_dim=16,params_b=0.1,max_model_len=512"
SHARED = "system-prompt:k=2,system=96"
RUNS = [(reg.name, policy) for reg in registry.registrations() if reg.recurrent_state
        for policy in (POLICIES if reg.prefix_cache else ("none",))]


def _config(strategy: str, policy: str = "none", **overrides):
    base = dict(strategy=strategy, model=STATE_MODEL, workload=SHARED, num_requests=30, rate=20.0,
                state_checkpoints=policy)
    return small_config(**{**base, **overrides})


def test_the_small_model_holds_a_state_of_whole_slots():
    m = model_from_name(STATE_MODEL)
    assert (m.attention_layers, m.kv_bytes_per_token("fp32"), m.state_bytes_per_seq()) == (2, 512, 2 * 2816)
    assert _config("paged").resolve().state == (2, 11, 0)  # ceil(5632 / 512) = 11 slots in two blocks of 8
    assert _config("radix", "tree").resolve().state == (2, 11, 256)  # checkpoints bounded by the pool alone


@pytest.mark.parametrize("strategy,policy", RUNS)
def test_every_step_partitions_the_pool_with_the_state_classes(strategy, policy):
    # the kernel, verified every step, on one run per strategy: the state changes which blocks a sequence holds,
    # not how its KV is read
    kernel = "numba" if policy in ("none", "tree") else "none"
    cfg = _config(strategy, policy, kv_slots=1024, kernel=kernel)
    result = simulate_checked(cfg)
    steps = result.steps
    parts = steps[list(C.SLOT_COLUMNS) + list(C.STATE_STEP_COLUMNS)].sum(axis=1)
    assert (parts == cfg.resolve().capacity_slots).all()
    assert (steps["state_slots"] == steps["num_running"] * 16).all()  # each running sequence: two blocks of 8
    assert result.summary["num_finished"] == 30 and result.summary["verify_max_rel_err"] < 1e-4
    assert (result.summary["kernel_backend"] == "numba") == (kernel == "numba")
    assert set(C.STATE_SUMMARY_KEYS) <= set(result.summary)
    if policy == "none":
        assert result.summary["prefix_hit_rate"] == 0.0 and (steps["state_checkpoint_slots"] == 0).all()


@pytest.mark.parametrize("strategy", ["paged-prefix", "radix"])
def test_none_hits_nothing_and_all_reaches_attention_only_with_room(strategy):
    """vLLM without a cache mode (issue #51250): 0 hits on shared prefixes; with every block checkpointed and
    memory to spare, exactly the hits of the same model with attention layers only."""
    cfg = _config(strategy, kernel="none", kv_slots=65536, num_requests=60)
    none = run_in_memory(cfg)[0].summary
    every = run_in_memory(dataclasses.replace(cfg, state_checkpoints="all"))[0].summary
    twin = run_in_memory(dataclasses.replace(cfg, model=ATTENTION_TWIN, state_checkpoints="none"))[0].summary
    assert none["prefix_hit_rate"] == 0.0 and twin["prefix_hit_rate"] > 0.5
    assert every["prefix_hit_rate"] == twin["prefix_hit_rate"]
    assert every["state_checkpoints_evicted"] == 0 and every["state_checkpoint_hits"] > 0


def test_the_clock_charges_each_state_read_written_and_copied():
    """A step's states: each sequence reads and writes its 5,632 B once, a checkpoint taken or restored is one
    more read and write; the recurrent layers' own operators run per row, attention's in two layers only."""
    from workbench.clock.profiles import make_clock
    from workbench.clock.step_cost import StepCost

    cfg = _config("paged-prefix", "all", kernel="none")
    res = cfg.resolve()
    clock = make_clock(cfg, res, cfg.block_size, 0.0, False, paged_kernel=True, overlap_load=False,
                       shared_link_gb_s=0.0)
    assert clock.state_bytes_per_seq == 5632.0
    step = StepCost(0, 4, 400.0, 400.0, 400.0, 0, 4, 0, 0, sampled_tokens=4)
    plain, copied = clock.cost_s(step), clock.cost_s(step._replace(state_copies=3))
    assert copied - plain == pytest.approx(2 * 3 * 5632 / clock.bytes_per_s, rel=1e-9)
    assert clock.state_s(4, 0) == 2 * 4 * 5632 / clock.bytes_per_s
    ops = {op.name: op for op in clock.forward.per_row}
    assert ops["qkv_proj"].kernels == 2 and ops["recurrence"].kernels == 4 and ops["mixer_in_proj"].kernels == 2
    assert ops["recurrence"].flops_per_row == 2 * (6 * 4 * 16 * 16 + 2 * 128 * 4)
    assert clock.attention_launch_s == 2 * 2 * clock.kernel_launch_s


def test_unified_pages_raise_the_block_to_hold_a_layer_state():
    """vLLM's hybrid allocator: one attention layer's page (block × 256 B a token at fp32) holds one recurrent
    layer's 2,816 B state: block 8 becomes 8 × ceil(2816 / 2048) = 16, block 4 becomes 4 × ceil(2816 / 1024) = 12."""
    assert _config("paged", block_size=8, unify_page_size=True).block_size == 16
    assert _config("paged", block_size=4, unify_page_size=True).block_size == 12
    res = _config("paged", block_size=4, unify_page_size=True).resolve()
    # two recurrent layers' pages: one block of the two attention layers, its 12 slots (11 of them state)
    assert (res.state.blocks_per_state, res.state.state_slots) == (1, 11)


def _main(tmp_path, *extra: str) -> int:
    from workbench.run import main

    out = tmp_path / "out"
    code = main(["--model", STATE_MODEL, "--kv-gib", "0.001", "--kernel", "none", "--workload", SHARED,
                 "--num-requests", "10", "--rate", "10", "--out", str(out), *extra])
    assert code != 2 or not out.exists()
    return code


BAD = {
    "dims off the parameters": ["--model", STATE_MODEL.replace("params_b=0.1", "params_b=0.0001")],
    "a policy without a prefix cache": ["--strategy", "paged", "--state-checkpoints", "all"],
    "checkpoints larger than the pool": ["--strategy", "radix", "--state-checkpoints", "all",
                                         "--state-cache-gib", "0.002"],
    "a strategy without state": ["--strategy", "contiguous-oracle"],
    "parallel samples": ["--strategy", "paged", "--n", "2"],
    "a policy on a model without state": ["--model", ATTENTION_TWIN, "--strategy", "radix",
                                          "--state-checkpoints", "tree"],
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case):
    assert _main(tmp_path, *BAD[case]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err


def test_the_good_input_beside_them_runs(tmp_path):
    assert _main(tmp_path, "--strategy", "radix", "--state-checkpoints", "all", "--state-cache-gib", "0.0005") == 0
