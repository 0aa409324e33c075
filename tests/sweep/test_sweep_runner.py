"""The sweep runner on the process pool, with a deterministic run function: layout, summary, resume, errors."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from sweep_fake_engine import fake_run

from workbench.columns import SUMMARY_KEYS, WALL_CLOCK_KEYS
from workbench.config import RunConfig
from workbench.sweep import LocalExecutor, SweepError, parse_spec, read_summary, run_sweep
from workbench.sweep.executors import default_jobs

SPEC = {"name": "t", "base": {"kv_slots": 4096}, "axes": {"strategy": ["paged", "contiguous-max"],
                                                          "block_size": [8, 16, 32]},
        "zip": [{"seed": [1, 2], "num_requests": [50, 60]}]}


def comparable(table: pd.DataFrame) -> pd.DataFrame:
    return table.drop(columns=list(WALL_CLOCK_KEYS))


def test_points_summary_and_layout(tmp_path):
    spec = parse_spec(SPEC)
    table = run_sweep(spec, tmp_path, executor=LocalExecutor(2), progress=False, run_fn=fake_run)
    points = spec.points()
    assert list(table["point_id"]) == [p.point_id for p in points]
    assert sorted(p.name for p in (tmp_path / "points").iterdir()) == sorted(p.point_id for p in points)
    for point, row in zip(points, table.itertuples(index=False), strict=True):
        files = sorted(f.name for f in (tmp_path / "points" / point.point_id).iterdir())
        assert files == ["config.json", "numba_threads.txt", "requests.parquet", "steps.parquet", "summary.json"]
        expected = fake_run(point.config)
        for key in SUMMARY_KEYS:
            if key not in WALL_CLOCK_KEYS:
                assert getattr(row, key) == expected[key], key
        assert row.strategy == point.config.strategy and row.block_size == point.config.block_size
        # config keys that the summary also reports keep the resolved value; the configured one is config_*
        assert row.config_num_requests == point.config.num_requests and row.config_kv_slots == 4096
    config_columns = [f"config_{k}" if k in SUMMARY_KEYS else k for k in RunConfig.field_names()]
    assert list(table.columns) == ["point_id", *config_columns, *SUMMARY_KEYS]
    pd.testing.assert_frame_equal(read_summary(tmp_path), table)


def test_summary_is_identical_whatever_the_worker_count(tmp_path):
    spec = parse_spec(SPEC)
    one = run_sweep(spec, tmp_path / "a", executor=LocalExecutor(1), progress=False, run_fn=fake_run)
    two = run_sweep(spec, tmp_path / "b", executor=LocalExecutor(2), progress=False, run_fn=fake_run)
    pd.testing.assert_frame_equal(comparable(one), comparable(two))
    assert not one["sim_wall_s"].equals(two["sim_wall_s"])  # the wall-clock keys really do differ


def test_resume_runs_only_missing_points(tmp_path, monkeypatch):
    log = tmp_path / "log"
    log.mkdir()
    monkeypatch.setenv("SWEEP_FAKE_LOG_DIR", str(log))
    spec = parse_spec(SPEC)
    points = spec.points()
    full = run_sweep(spec, tmp_path / "out", executor=LocalExecutor(2), progress=False, run_fn=fake_run)
    assert len(list(log.iterdir())) == len(points)
    # lose two points, leave debris of a killed one
    for point in points[3:5]:
        shutil.rmtree(tmp_path / "out" / "points" / point.point_id)
    (tmp_path / "out" / "points" / f".tmp-{points[7].point_id}-deadbeef").mkdir()
    resumed = run_sweep(spec, tmp_path / "out", executor=LocalExecutor(2), resume=True, progress=False,
                        run_fn=fake_run)
    runs = sorted(p.name.split("-")[0] for p in log.iterdir())
    assert runs == sorted([p.point_id for p in points] + [p.point_id for p in points[3:5]])
    assert not list((tmp_path / "out" / "points").glob(".tmp-*"))
    pd.testing.assert_frame_equal(comparable(full), comparable(resumed))
    # the kept points' wall-clock values are read back from their files, not recomputed
    assert list(full["sim_wall_s"].drop(index=[3, 4])) == list(resumed["sim_wall_s"].drop(index=[3, 4]))


def test_an_existing_sweep_is_refused_and_replaced_only_when_forced(tmp_path, monkeypatch):
    log = tmp_path / "log"
    log.mkdir()
    monkeypatch.setenv("SWEEP_FAKE_LOG_DIR", str(log))
    spec = parse_spec({"axes": {"seed": [0, 1]}})
    run_sweep(spec, tmp_path / "out", executor=LocalExecutor(1), progress=False, run_fn=fake_run)
    before = sorted(p.name for p in (tmp_path / "out" / "points").iterdir())
    with pytest.raises(ValueError, match="already holds a sweep; pass --resume to continue it or --force"):
        run_sweep(spec, tmp_path / "out", executor=LocalExecutor(1), progress=False, run_fn=fake_run)
    assert sorted(p.name for p in (tmp_path / "out" / "points").iterdir()) == before and len(list(log.iterdir())) == 2
    stale = tmp_path / "out" / "points" / "0123456789ab"
    stale.mkdir()
    run_sweep(spec, tmp_path / "out", executor=LocalExecutor(1), force=True, progress=False, run_fn=fake_run)
    assert len(list(log.iterdir())) == 4 and not stale.exists()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["points", "summary.parquet"]  # lock released


def test_a_failing_point_is_named_and_finished_points_are_kept(tmp_path):
    spec = parse_spec({"axes": {"seed": [1, 666, 2]}})
    with pytest.raises(SweepError, match=r"point 1 \[\w{12}\] \(seed=666\) failed: RuntimeError: seed 666 is cursed"):
        run_sweep(spec, tmp_path, executor=LocalExecutor(1), progress=False, run_fn=fake_run)
    bad = spec.points()[1].point_id
    assert not (tmp_path / "points" / bad).exists()
    assert not (tmp_path / "summary.parquet").exists()
    assert not list((tmp_path / "points").glob(".tmp-*"))
    finished = {p.name for p in (tmp_path / "points").iterdir()}
    assert finished <= {spec.points()[0].point_id, spec.points()[2].point_id}
    for name in finished:
        assert json.loads((tmp_path / "points" / name / "summary.json").read_text())["kernel_backend"] == "none"


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_each_worker_gets_its_share_of_the_cores(tmp_path, jobs):
    spec = parse_spec({"axes": {"seed": [0, 1, 2]}})
    run_sweep(spec, tmp_path, executor=LocalExecutor(jobs), progress=False, run_fn=fake_run)
    expected = str(max(1, default_jobs() // jobs))
    for point in spec.points():
        assert (tmp_path / "points" / point.point_id / "numba_threads.txt").read_text() == expected


def test_threads_per_task_can_be_pinned(tmp_path):
    spec = parse_spec({"axes": {"seed": [0]}})
    run_sweep(spec, tmp_path, executor=LocalExecutor(1, threads_per_task=1), progress=False, run_fn=fake_run)
    assert (tmp_path / "points" / spec.points()[0].point_id / "numba_threads.txt").read_text() == "1"
    with pytest.raises(ValueError, match="threads_per_task must be >= 1"):
        LocalExecutor(1, threads_per_task=0)
