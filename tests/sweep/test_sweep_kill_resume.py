"""A sweep killed with SIGKILL mid-run, then resumed, equals an uninterrupted one: no lost or duplicated point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
from sweep_fake_engine import fake_run

from workbench.columns import WALL_CLOCK_KEYS
from workbench.sweep import LocalExecutor, parse_spec, run_sweep

SPEC = {"name": "kill", "axes": {"block_size": [4, 8, 16, 32], "seed": [0, 1, 2, 3]}}
HERE = Path(__file__).resolve().parent

DRIVER = textwrap.dedent("""
    import sys
    from sweep_fake_engine import fake_run
    from workbench.sweep import LocalExecutor, parse_spec, run_sweep

    if __name__ == "__main__":
        run_sweep(parse_spec({spec!r}), sys.argv[1], executor=LocalExecutor(2), resume=sys.argv[2] == "resume",
                  progress=False, run_fn=fake_run)
""")


def start_driver(tmp_path: Path, out: Path, mode: str, log: Path, sleep_s: float) -> subprocess.Popen:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(spec=SPEC))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "SWEEP_FAKE_LOG_DIR": str(log), "SWEEP_FAKE_SLEEP_S": str(sleep_s)}
    # a new session: the kill below reaches the driver and every pool worker at once
    return subprocess.Popen([sys.executable, str(driver), str(out), mode], env=env, start_new_session=True,
                            stderr=subprocess.PIPE, text=True)


def complete_points(out: Path) -> set[str]:
    points = out / "points"
    return {p.name for p in points.iterdir() if not p.name.startswith(".")} if points.is_dir() else set()


def test_sigkill_then_resume_equals_uninterrupted(tmp_path):
    spec = parse_spec(SPEC)
    ids = [p.point_id for p in spec.points()]
    out, log = tmp_path / "out", tmp_path / "log"
    log.mkdir()

    proc = start_driver(tmp_path, out, "fresh", log, sleep_s=0.3)
    deadline = time.monotonic() + 120
    while len(complete_points(out)) < 4:
        assert proc.poll() is None, f"the sweep ended before it could be killed: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "the sweep made no progress"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    survivors = complete_points(out)
    assert 4 <= len(survivors) < len(ids), "the kill came too late to interrupt the sweep"
    assert survivors <= set(ids)
    assert not (out / "summary.parquet").exists()
    for point_id in survivors:  # a point directory exists only when complete
        assert (out / "points" / point_id / "summary.json").is_file()
    runs_before = {p.name for p in log.iterdir()}

    proc = start_driver(tmp_path, out, "resume", log, sleep_s=0.0)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert complete_points(out) == set(ids)
    assert not list((out / "points").glob(".tmp-*"))
    rerun = [p.name.split("-")[0] for p in log.iterdir() if p.name not in runs_before]
    assert sorted(rerun) == sorted(set(ids) - survivors), "resume must run exactly the points not finished"

    resumed = pd.read_parquet(out / "summary.parquet")
    assert list(resumed["point_id"]) == ids
    uninterrupted = run_sweep(spec, tmp_path / "ref", executor=LocalExecutor(2), progress=False, run_fn=fake_run)
    pd.testing.assert_frame_equal(resumed.drop(columns=list(WALL_CLOCK_KEYS)),
                                  uninterrupted.drop(columns=list(WALL_CLOCK_KEYS)))
