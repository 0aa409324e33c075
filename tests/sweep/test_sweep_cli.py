"""`python -m workbench.sweep` end to end on the real engine: local and Dask give the same summary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from workbench.columns import WALL_CLOCK_KEYS
from workbench.experiments import find_experiment
from workbench.paths import REPO_ROOT
from workbench.sweep import load_spec
from workbench.sweep.__main__ import run as main
from workbench.sweep.cli import DEFAULT_EXPERIMENT

pytest.importorskip("workbench.engine", reason="the CLI runs the engine")

TINY = {"model": "custom:layers=2,kv_heads=2,heads=4,head_dim=64,max_model_len=512", "kv_slots": 3072,
        "kernel": "none", "num_requests": 50, "rate": 20.0, "workload": "sharegpt-like"}


def write_experiment(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({"figure": "memory_waste", "base": TINY,
                                    "axes": {"strategy": ["contiguous-max", "contiguous-oracle", "paged"]},
                                    "zip": [{"seed": [0, 1]}]}))
    return path


def sweep(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "workbench.sweep", *args], capture_output=True, text=True,
                          env=env, timeout=600, cwd=REPO_ROOT)


def test_local_and_dask_give_the_same_summary(tmp_path):
    experiment = write_experiment(tmp_path)
    local = sweep(str(experiment), "--out", str(tmp_path / "local"), "-j", "2")
    assert local.returncode == 0, local.stderr
    assert "tiny: 6 points" in local.stdout and "contiguous-oracle" in local.stdout
    assert (tmp_path / "local" / "memory_waste.png").is_file() and (tmp_path / "local" / "memory_waste.pdf").is_file()
    assert "point/s]" in local.stderr or "s/point]" in local.stderr  # the progress bar went to stderr

    dask = sweep(str(experiment), "--out", str(tmp_path / "dask"), "--executor", "dask", "--workers", "2",
                 "--no-progress")
    assert dask.returncode == 0, dask.stderr
    a = pd.read_parquet(tmp_path / "local" / "summary.parquet").drop(columns=list(WALL_CLOCK_KEYS))
    b = pd.read_parquet(tmp_path / "dask" / "summary.parquet").drop(columns=list(WALL_CLOCK_KEYS))
    pd.testing.assert_frame_equal(a, b)
    assert list(a["point_id"]) == [p.point_id for p in load_spec(experiment).points()]
    assert (a["num_finished"] == TINY["num_requests"]).all()
    # the steps and requests of every point are bit-identical too
    for point_id in a["point_id"]:
        for table in ("steps.parquet", "requests.parquet"):
            pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "local" / "points" / point_id / table),
                                          pd.read_parquet(tmp_path / "dask" / "points" / point_id / table))


def test_bad_experiment_is_one_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("axes:\n  stratgy: [paged]\n")
    assert main([str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"error: {bad}: axes.stratgy: unknown key 'stratgy'; did you mean 'strategy'?"
    assert not (tmp_path / "out").exists()


def test_an_unknown_figure_fails_before_the_sweep(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("figure: memory_wast\naxes: {seed: [0]}\n")
    assert main([str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "unknown figure 'memory_wast'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_contradictory_flags(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(write_experiment(tmp_path)), "--scheduler", "tcp://127.0.0.1:1"])
    assert "--scheduler and --workers belong to --executor dask" in capsys.readouterr().err


def test_the_default_experiment_is_the_quickstart():
    spec = load_spec(find_experiment(DEFAULT_EXPERIMENT))
    strategies = [p.config.strategy for p in spec.points()]
    assert {"contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged"} <= set(strategies)
    assert all(p.config.kernel != "none" and p.config.verify_every > 0 for p in spec.points())
    assert spec.figure == "memory_waste"


def test_the_table_shows_saturated_memory_shares_like_the_figure():
    from workbench.sweep import parse_spec
    from workbench.sweep.cli import comparison_table

    spec = parse_spec({"axes": {"strategy": ["paged", "contiguous-max"]}})
    table = pd.DataFrame({"point_id": ["a", "b"], "strategy": ["paged", "contiguous-max"],
                          "mem_token_frac": [0.5, 0.2], "mem_token_frac_sat": [0.9, 0.25],
                          "saturated_step_frac": [0.7, 0.4]})
    assert "mem_token_frac_sat" in comparison_table(spec, table) and "0.9" in comparison_table(spec, table)
    # a point that never saturated (its _sat figures are 0): all steps for every point
    table.loc[1, ["mem_token_frac_sat", "saturated_step_frac"]] = 0.0
    shown = comparison_table(spec, table)
    assert "mem_token_frac_sat" not in shown and "mem_token_frac" in shown and "0.5" in shown


@pytest.mark.parametrize("argv", [["-j", "0"], ["-j", "1025"], ["-j", str(2**40)],
                                  ["--executor", "dask", "--workers", "0"],
                                  ["--executor", "dask", "--workers", "100000"]])
def test_a_worker_count_outside_its_range_is_one_line(tmp_path, capsys, argv):
    assert main(["quickstart", "--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "must be in [1, 1024]" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
