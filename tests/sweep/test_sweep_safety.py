"""A sweep never destroys or mixes results: an existing OUT needs --resume or --force, one sweep at a time holds
OUT, --resume checks every kept point, names are not paths, and huge sweeps need --yes."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sweep_fake_engine import SerialExecutor, fake_run

from workbench import columns as C
from workbench.paths import REPO_ROOT
from workbench.sweep import SpecError, SweepError, load_spec, parse_spec, run_sweep
from workbench.sweep.__main__ import run as main
from workbench.sweep.lock import LOCK_FILE, SweepLock, SweepLocked
from workbench.sweep.runner import point_problem

SPEC = {"name": "safe", "axes": {"seed": [0, 1, 2]}}
TINY = {"model": "custom:layers=2,kv_heads=2,heads=4,head_dim=16,max_model_len=512", "kv_slots": 2048,
        "kernel": "none", "num_requests": 10, "rate": 20.0, "workload": "alpaca-like"}
HERE = Path(__file__).resolve().parent


def sweep(spec: dict, out: Path, **kwargs):
    return run_sweep(parse_spec(spec), out, executor=SerialExecutor(), progress=False, run_fn=fake_run, **kwargs)


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def runs_logged(monkeypatch, tmp_path) -> Path:
    log = tmp_path / "log"
    log.mkdir()
    monkeypatch.setenv("SWEEP_FAKE_LOG_DIR", str(log))
    return log


def test_a_failing_forced_sweep_puts_the_replaced_points_back(tmp_path, capsys):
    out = tmp_path / "out"
    sweep(SPEC, out)
    before = tree(out / "points")
    summary = (out / "summary.parquet").read_bytes()
    with pytest.raises(SweepError, match="seed 666 is cursed"):
        sweep({"axes": {"seed": [666]}}, out, force=True)
    assert tree(out / "points") == before and (out / "summary.parquet").read_bytes() == summary
    assert not list(out.glob(".tmp-*"))
    assert f"{out}: a --force sweep did not finish; 3 of the points it was replacing are back in {out}/points" in \
        capsys.readouterr().err


def test_a_live_lock_refuses_a_second_sweep_and_a_stale_one_is_taken_over(tmp_path):
    out = tmp_path / "out"
    with SweepLock(out):
        with pytest.raises(SweepLocked, match=rf"{out} is in use by another sweep \(pid {os.getpid()} on "):
            sweep(SPEC, out)
    assert not (out / LOCK_FILE).exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (out / LOCK_FILE).write_text(f"{dead.pid} {os.uname().nodename} token\n")
    sweep(SPEC, out)  # the process that held it is gone
    assert not (out / LOCK_FILE).exists() and (out / "summary.parquet").is_file()


def test_two_sweeps_started_together_one_runs_one_is_refused(tmp_path):
    out = tmp_path / "out"
    driver = ("import sys\nfrom sweep_fake_engine import fake_run\n"
              "from workbench.sweep import LocalExecutor, parse_spec, run_sweep\n"
              "from workbench.sweep.lock import SweepLocked\n"
              "if __name__ == '__main__':\n"
              "    try:\n"
              f"        run_sweep(parse_spec({SPEC!r}), sys.argv[1], executor=LocalExecutor(1), progress=False,\n"
              "                  run_fn=fake_run, resume=True)\n"
              "    except SweepLocked:\n"
              "        sys.exit(3)\n")
    (tmp_path / "driver.py").write_text(driver)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "SWEEP_FAKE_SLEEP_S": "1.0"}
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(out)], env=env) for _ in range(2)]
    codes = sorted(p.wait(timeout=120) for p in procs)
    assert codes == [0, 3]
    assert sorted(p.name for p in (out / "points").iterdir()) == sorted(p.point_id for p in parse_spec(SPEC).points())


@pytest.mark.parametrize("damage,problem", [
    (lambda d: (d / "summary.json").unlink(), "summary.json is missing"),
    (lambda d: (d / "steps.parquet").unlink(), "steps.parquet is missing"),
    (lambda d: (d / "summary.json").write_text("{not json"), "summary.json is unreadable: JSONDecodeError"),
    (lambda d: (d / "summary.json").write_text("{}"), "summary.json lacks kv_slots"),
    (lambda d: (d / "summary.json").write_text("[1, 2]"), "summary.json is a list, not a JSON object"),
    (lambda d: (d / "requests.parquet").write_bytes(b"PAR1 truncated"), "requests.parquet is unreadable: "),
    (lambda d: (d / "config.json").write_text(json.dumps({"config": {"seed": 77}})),
     "its config.json describes another configuration"),
])
def test_resume_moves_a_broken_point_aside_and_runs_it_again(tmp_path, monkeypatch, capsys, damage, problem):
    log = runs_logged(monkeypatch, tmp_path)
    out = tmp_path / "out"
    sweep(SPEC, out)
    points = parse_spec(SPEC).points()
    broken_id = points[1].point_id
    damage(out / "points" / broken_id)
    damaged = tree(out / "points" / broken_id)
    capsys.readouterr()
    sweep(SPEC, out, resume=True)
    reran = sorted(p.name.split("-")[0] for p in log.iterdir())
    assert reran == sorted([p.point_id for p in points] + [broken_id])  # exactly the broken one ran again
    [moved] = (out / "broken").iterdir()
    assert moved.name.startswith(broken_id) and tree(moved) == damaged  # nothing deleted
    err = capsys.readouterr().err
    assert f"point 1 [{broken_id}]: {problem}" in err and f"moved to {moved}, running it again" in err
    assert json.loads((out / "points" / broken_id / "summary.json").read_text())["kernel_backend"] == "none"


@pytest.mark.parametrize("name", ["../victim", "/etc", "a/b", ".", "..", ".hidden", "-rf", "x" * 101, "sp ace"])
def test_a_sweep_name_is_an_identifier_not_a_path(name):
    with pytest.raises(SpecError, match="name: expected an identifier"):
        parse_spec({"name": name, "axes": {"seed": [0]}})


def test_a_file_stem_that_is_no_identifier_asks_for_a_name(tmp_path):
    path = tmp_path / "my sweep.yaml"
    path.write_text("axes: {seed: [0]}\n")
    with pytest.raises(SpecError, match=r"name \(the file's stem, 'my sweep'\): expected an identifier"):
        load_spec(path)


def main_status(argv: list[str]) -> int:
    """The sweep CLI's exit status, whether returned or raised by the argument parser."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_more_than_ten_thousand_points_need_yes(tmp_path, capsys):
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump({"axes": {"seed": list(range(101)), "block_size": list(range(1, 101))}}))
    start = time.perf_counter()
    assert main_status([str(path), "--out", str(tmp_path / "out")]) == 2
    assert time.perf_counter() - start < 30  # refused before the 10,100 points were expanded and checked
    assert capsys.readouterr().err == f"error: {path}: expands to 10,100 points, more than 10,000; pass --yes to run " \
                                      "it anyway\n"
    assert not (tmp_path / "out").exists()


def test_cli_refuses_an_existing_sweep_in_one_line_and_resume_with_force(tmp_path, capsys):
    experiment = tmp_path / "tiny.yaml"
    experiment.write_text(yaml.safe_dump({"axes": {"seed": [0]}}))
    out = tmp_path / "out"
    sweep({"axes": {"seed": [0]}}, out)
    before = tree(out)
    assert main_status([str(experiment), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: --out {out} already holds a sweep; pass --resume to continue it or "
                                       "--force to replace it\n")
    assert main_status([str(experiment), "--out", str(out), "--resume", "--force"]) == 2
    assert "choose one" in capsys.readouterr().err
    assert tree(out) == before


def test_an_unreachable_dask_scheduler_is_one_line_within_seconds(tmp_path, capsys):
    pytest.importorskip("dask.distributed")
    experiment = tmp_path / "tiny.yaml"
    experiment.write_text(yaml.safe_dump({"axes": {"seed": [0]}, "base": {"kernel": "none"}}))
    start = time.perf_counter()
    status = main_status([str(experiment), "--out", str(tmp_path / "out"), "--executor", "dask", "--scheduler",
                          "tcp://127.0.0.1:9", "--no-progress"])
    assert time.perf_counter() - start < 20
    err = capsys.readouterr().err
    assert status == 1 and err.startswith("error: cannot reach the Dask scheduler at tcp://127.0.0.1:9 within 5 s")
    assert err.count("\n") == 1
    assert not (tmp_path / "out" / LOCK_FILE).exists()


def test_ctrl_c_exits_130_in_one_line_and_resume_finishes_the_sweep(tmp_path):
    # 40 points of 0.5 s on two workers: ~10 s, so the sweep is still running when Ctrl-C reaches it even
    # on a loaded machine where this process polls late
    num_points = 40
    spec = {"name": "ctrl-c", "axes": {"seed": list(range(num_points))}}
    driver = tmp_path / "driver.py"
    # Ctrl-C as a terminal delivers it to a program it started: a test run started in the background
    # (`make test &`) hands its children SIGINT ignored, which Python keeps ignoring
    driver.write_text(
        "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import sys\nfrom sweep_fake_engine import fake_run\nimport workbench.sweep.cli as cli\n"
        "import workbench.sweep.runner as runner\n"
        "from workbench.sweep import LocalExecutor\n"
        "if __name__ == '__main__':\n"
        "    real = runner.run_sweep\n"
        "    runner_kwargs = dict(run_fn=fake_run)\n"
        "    cli.run_sweep = lambda *a, **k: real(*a, **{**k, **runner_kwargs, 'executor': LocalExecutor(2)})\n"
        "    sys.exit(cli.main(sys.argv[1:]))\n")
    experiment = tmp_path / "ctrl-c.yaml"
    experiment.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "SWEEP_FAKE_SLEEP_S": "0.5"}
    proc = subprocess.Popen([sys.executable, str(driver), str(experiment), "--out", str(out), "--no-progress"],
                            env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (out / "points").is_dir() or not any(p.name[0] != "." for p in (out / "points").iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err == f"interrupted; finished points are kept in {out}/points: rerun with --resume to continue\n"
    assert not (out / LOCK_FILE).exists()
    env["SWEEP_FAKE_SLEEP_S"] = "0"
    resumed = subprocess.run([sys.executable, str(driver), str(experiment), "--out", str(out), "--resume",
                              "--no-progress"], env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert len([p for p in (out / "points").iterdir()]) == num_points


def test_the_sweep_cli_output_cut_off_by_its_reader_ends_quietly(tmp_path):
    experiment = tmp_path / "tiny.yaml"
    experiment.write_text(yaml.safe_dump({"name": "pipe", "axes": {"seed": [0]}, "base": TINY}))
    proc = subprocess.Popen([sys.executable, "-m", "workbench.sweep", str(experiment), "--out", str(tmp_path / "out"),
                             "--no-progress", "-j", "1"], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=300)
    assert proc.returncode == 128 + signal.SIGPIPE and "Traceback" not in err, err


HOSTILE_SUMMARY_VALUES = st.sampled_from([math.nan, math.inf, -math.inf, "12", "", None, True, False, [], {}, 1, 0.5])


def holds_what_a_summary_holds(key: str, value) -> bool:
    """What the engine writes for `key`, stated independently of workbench.results."""
    if key in C.SUMMARY_TEXT_KEYS:
        return isinstance(value, str)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(C.SUMMARY_KEYS), value=HOSTILE_SUMMARY_VALUES, drop=st.booleans())
def test_resume_keeps_a_point_only_when_its_summary_holds_numbers_where_numbers_belong(tmp_path_factory, key, value,
                                                                                       drop):
    out = tmp_path_factory.mktemp("resume") / "out"
    spec = parse_spec({"name": "kept", "axes": {"seed": [0]}})
    run_sweep(spec, out, executor=SerialExecutor(), progress=False, run_fn=fake_run)
    [point] = spec.points()
    summary_path = out / "points" / point.point_id / "summary.json"
    summary = json.loads(summary_path.read_text())
    if drop:
        del summary[key]
    else:
        summary[key] = value
    summary_path.write_text(json.dumps(summary))  # NaN and Infinity as Python's json writes them
    damaged = tree(out / "points")
    run_sweep(spec, out, executor=SerialExecutor(), progress=False, run_fn=fake_run, resume=True)
    kept = not drop and holds_what_a_summary_holds(key, value)
    if kept:
        assert not (out / "broken").exists() and tree(out / "points") == damaged
    else:
        [moved] = (out / "broken").iterdir()
        assert {f"{point.point_id}/{k}": v for k, v in tree(moved).items()} == damaged
        assert point_problem(out / "points", point) is None
    assert len(pd.read_parquet(out / "summary.parquet")) == 1  # the table builds from what was kept
