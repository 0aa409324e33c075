"""Engine behaviour: rejections with reasons, determinism, beams, sessions, clocks, output files."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.engine.conftest import checked_strategy, replace, simulate_checked, small_config
from workbench import columns as C
from workbench.engine import run, simulate
from workbench.workload import build_workload


def test_too_long_for_max_model_len_is_rejected_with_reason():
    cfg = small_config(strategy="paged", workload="fixed:prompt=300,output=300", num_requests=3, kernel="none")
    result = simulate_checked(cfg)
    assert result.summary["num_rejected"] == 3
    assert set(result.requests["status"]) == {"rejected: prompt+output (600) > max_model_len (512)"}
    assert result.requests["admitted_s"].isna().all()


@pytest.mark.parametrize("strategy", ["paged", "contiguous-max", "contiguous-oracle"])
def test_group_larger_than_the_pool_is_rejected_and_the_rest_finish(strategy):
    # 4 samples of 100 + 200 tokens need ~900 slots: more than the 640-slot pool, so every request is
    # rejected, by admission (contiguous reserve up front) or when it is alone and cannot grow (paged)
    cfg = small_config(strategy=strategy, kv_slots=640, workload="fixed:prompt=100,output=200", n=4, num_requests=3)
    result = simulate_checked(cfg)
    statuses = result.requests["status"]
    # the strategy's own reason when it refuses the group in an empty pool (contiguous), else the scheduler's
    assert statuses.str.match(r"rejected: (needs more KV slots than the whole pool|no free extent of \d+ slots)").all()
    assert result.summary["num_rejected"] == 3 and result.summary["num_finished"] == 0
    ok = simulate_checked(replace(cfg, n=1))  # the same requests with one sample each fit
    assert ok.summary["num_finished"] == 3


def test_every_request_ends_finished_or_rejected():
    cfg = small_config(strategy="contiguous-pow2", kernel="none", workload="sharegpt-like", num_requests=200,
                       kv_slots=1024, rate=100.0)
    requests = simulate_checked(cfg).requests
    assert len(requests) == 200
    assert requests["status"].map(lambda s: s == "finished" or s.startswith("rejected: ")).all()
    finished = requests[requests["status"] == "finished"]
    assert finished[["admitted_s", "first_token_s", "finish_s"]].notna().all().all()


def test_same_config_and_seed_give_identical_files(tmp_path):
    cfg = small_config(strategy="paged-prefix", workload="system-prompt:k=2,system=40,lengths=alpaca", n=2,
                       kv_slots=1024)
    a = run(cfg, tmp_path / "a")
    b = run(cfg, tmp_path / "b")
    for name in ("steps.parquet", "requests.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a" / name), pd.read_parquet(tmp_path / "b" / name),
                                      check_exact=True)
    same = [k for k in C.SUMMARY_KEYS if k not in C.WALL_CLOCK_KEYS]
    assert json.dumps({k: a[k] for k in same}) == json.dumps({k: b[k] for k in same})
    other = run(replace(cfg, seed=2))
    assert other["sim_time_s"] != a["sim_time_s"]


def test_output_files_follow_the_contract(tmp_path):
    cfg = small_config(strategy="paged", num_requests=8)
    summary = run(cfg, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "requests.parquet", "steps.parquet",
                                                         "summary.json"]
    assert tuple(pd.read_parquet(tmp_path / "steps.parquet").columns) == C.STEP_COLUMNS
    assert tuple(pd.read_parquet(tmp_path / "requests.parquet").columns) == C.REQUEST_COLUMNS
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert tuple(on_disk) == C.SUMMARY_KEYS
    assert on_disk["num_finished"] == summary["num_finished"] == 8
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["config"] == cfg.to_dict()
    assert config["seed"] == cfg.seed and config["kernel_backend"] == "numba"
    assert config["resolved"]["kv_slots"] == 2048


def test_steps_table_is_deterministic_under_roofline_but_measures_under_measured_clock():
    cfg = small_config(strategy="paged", num_requests=6)
    roofline = simulate_checked(cfg)
    measured = simulate_checked(replace(cfg, clock="measured"))
    assert (roofline.steps["kernel_time_s"] == 0).all()
    assert (measured.steps["kernel_time_s"] > 0).all()
    assert measured.summary["kernel_time_s"] > 0 and measured.summary["kernel_gbps"] > 0
    # same schedule decisions up to the clock: the same tokens are generated in total
    assert measured.summary["throughput_tok_s"] * measured.summary["sim_time_s"] == pytest.approx(
        roofline.summary["throughput_tok_s"] * roofline.summary["sim_time_s"])


@pytest.mark.parametrize("strategy", ["paged", "contiguous-oracle"])
def test_beam_search_forks_and_prunes_with_verification(strategy):
    cfg = small_config(strategy=strategy, workload="fixed:prompt=37,output=24", beam_width=3, num_requests=4)
    result = simulate_checked(cfg)
    assert result.summary["num_finished"] == 4
    assert result.summary["verify_max_rel_err"] <= 1e-5
    assert result.summary["cow_copies"] > 0
    if strategy == "paged":
        assert result.summary["block_sharing_saving_frac"] > 0
    else:
        assert result.summary["block_sharing_saving_frac"] == 0


def test_multi_turn_sessions_hit_the_prefix_cache():
    cfg = small_config(strategy="paged-prefix", workload="multi-turn:turns=3,think=0.5,lengths=alpaca",
                       num_requests=12, kv_slots=4096, rate=4.0)
    result = simulate_checked(cfg)
    assert result.summary["num_finished"] == 12
    assert result.summary["prefix_hit_rate"] > 0
    assert result.summary["verify_max_rel_err"] <= 1e-5


def test_saturated_figures_are_zero_without_saturation():
    cfg = small_config(strategy="paged", kernel="none", num_requests=3, rate=0.01)
    summary = simulate_checked(cfg).summary
    assert all(summary[k] == 0 for k in C.MEM_FRAC_SAT_KEYS)
    assert summary["saturated_step_frac"] == 0
    assert summary["mean_batch_size_sat"] == 0 and summary["throughput_tok_s_sat"] == 0
    assert sum(summary[k] for k in C.MEM_FRAC_KEYS) == pytest.approx(1.0)


def test_max_num_seqs_caps_the_batch():
    cfg = small_config(strategy="paged", kernel="none", num_requests=40, rate=1000.0, max_num_seqs=5,
                       kv_slots=8192)
    steps = simulate_checked(cfg).steps
    assert steps["num_running"].max() == 5
    assert np.all(steps["num_decode_tokens"] <= 5)


def test_group_wider_than_max_num_seqs_is_rejected_not_stuck():
    wide = small_config(strategy="paged", kernel="none", n=4, num_requests=3)
    narrow = replace(wide, n=1, max_num_seqs=2)  # the config allows it; these requests never can run
    result = simulate(narrow, build_workload(wide), checked_strategy(narrow))
    assert set(result.requests["status"]) == {"rejected: 4 sequences > max_num_seqs (2)"}
    assert len(result.steps) == 0


def test_kernel_every_runs_attention_on_every_kth_step_only():
    cfg = small_config(strategy="paged", num_requests=6, clock="measured", kernel_every=3, verify_every=3)
    steps = simulate_checked(cfg).steps
    ran = steps["kernel_time_s"].to_numpy() > 0
    assert ran.any()
    assert (ran == (steps["step"].to_numpy() % 3 == 0)).all()


def test_progress_bar_counts_finished_requests(capsys):
    cfg = small_config(strategy="paged", kernel="none", num_requests=5)
    assert run(cfg, progress=True)["num_finished"] == 5
    assert "5/5" in capsys.readouterr().err
