"""Signals to a running sweep, fuzzed (hypothesis): SIGINT, SIGTERM or SIGKILL to `python -m workbench.sweep` at any
moment, with one or two workers, over a fresh OUT or during a `--force` replacement. Afterwards no process the
sweep started is left running, and the next invocation (`--resume`) finishes the sweep with every point, puts
back what a killed `--force` had moved aside and leaves no temporary behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sweep_fake_engine import fake_run

from workbench.sweep import LocalExecutor, parse_spec, run_sweep

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find processes")

SIGNAL_EXAMPLES = 2  # each starts two or three sweeps of spawned workers: ~5 s apiece on a shared core
SLOW_SIGNAL_EXAMPLES = 20  # deselect with -m "not slow"
HERE = Path(__file__).resolve().parent
NEW = {"name": "signalled", "axes": {"seed": list(range(6))}}
OLD = {"name": "signalled", "axes": {"seed": [100, 101, 102]}}
DRIVER = """import sys
from sweep_fake_engine import fake_run
import workbench.sweep.cli as cli
import workbench.sweep.runner as runner
from workbench.clean_exit import run_cli
from workbench.sweep import LocalExecutor
if __name__ == '__main__':
    real, jobs = runner.run_sweep, int(sys.argv[1])
    cli.run_sweep = lambda *a, **k: real(*a, **{**k, 'run_fn': fake_run, 'executor': LocalExecutor(jobs)})
    sys.exit(run_cli(lambda: cli.main(sys.argv[2:])))
"""
# SIGKILL cannot be held off: a worker spawned an instant before it finds its start-up pipe closed and says so
# from multiprocessing's start-up code, before any of ours runs in it (it exits at once all the same)
ORPHANED_AT_START = re.compile(r"Traceback \(most recent call last\):\n(?:  .*\n)*?.*in spawn_main\n(?:  .*\n)*"
                               r"EOFError: Ran out of input\n")
DEADLINE_S = 120  # every wait below is bounded by this


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else int(fields[1])  # a zombie is gone for our purposes


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            parent = parent_of(int(entry.name))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    return parent_of(pid) is not None


def finished_points(out: Path) -> int:
    points = out / "points"
    ids = {p.point_id for p in parse_spec(NEW).points()}
    return sum(1 for p in points.iterdir() if p.name in ids) if points.is_dir() else 0


def start(tmp: Path, out: Path, jobs: int, *flags: str, sleep_s: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "SWEEP_FAKE_SLEEP_S": str(sleep_s)}
    return subprocess.Popen([sys.executable, str(tmp / "driver.py"), str(jobs), str(tmp / "new.yaml"), "--out",
                             str(out), "--no-progress", *flags], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


SIGNALLED = dict(signum=st.sampled_from([signal.SIGINT, signal.SIGTERM, signal.SIGKILL]),
                 jobs=st.sampled_from([1, 2]), after_points=st.integers(0, 2), force=st.booleans())
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@settings(SETTINGS, max_examples=SIGNAL_EXAMPLES)
@given(**SIGNALLED)
def test_a_signalled_sweep_leaves_no_process_and_resume_completes_it(tmp_path_factory, signum, jobs, after_points,
                                                                      force):
    signalled_sweep(tmp_path_factory, signum, jobs, after_points, force)


@pytest.mark.slow
@settings(SETTINGS, max_examples=SLOW_SIGNAL_EXAMPLES)
@given(**SIGNALLED)
def test_many_signalled_sweeps(tmp_path_factory, signum, jobs, after_points, force):
    signalled_sweep(tmp_path_factory, signum, jobs, after_points, force)


def signalled_sweep(tmp_path_factory, signum: int, jobs: int, after_points: int, force: bool) -> None:
    """Signal a sweep while it runs (its points are slowed down), then check what is left and resume it."""
    tmp = tmp_path_factory.mktemp("signal")
    (tmp / "driver.py").write_text(DRIVER)
    (tmp / "new.yaml").write_text(yaml.safe_dump(NEW))
    out = tmp / "out"
    old = None
    if force:
        run_sweep(parse_spec(OLD), out, executor=LocalExecutor(1), progress=False, run_fn=fake_run)
        old = tree(out / "points")
    proc = start(tmp, out, jobs, *(["--force"] if force else []), sleep_s=0.4)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while finished_points(out) < after_points or not descendants(proc.pid):
            assert time.monotonic() < deadline, "the sweep never got going"
            if proc.poll() is not None:
                break
            time.sleep(0.02)
        started = descendants(proc.pid)
        if proc.poll() is not None:
            event("finished before the signal")
        else:
            event(f"{signal.Signals(signum).name} with {len(started)} processes below it")
            os.kill(proc.pid, signum)  # the sweep process alone, as `kill PID` does
        _, err = proc.communicate(timeout=DEADLINE_S)
        if signum == signal.SIGKILL:
            err = ORPHANED_AT_START.sub("", err)
        assert "Traceback" not in err, err
        while any(alive(pid) for pid in started):  # the kernel needs a moment to deliver the parent's death
            assert time.monotonic() < deadline, f"left running: {sorted(p for p in started if alive(p))}"
            time.sleep(0.05)
        if signum != signal.SIGKILL:
            assert proc.returncode in (0, 130) and (proc.returncode == 0 or "interrupted" in err), err
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever a failing test left in the sweep's session
        except ProcessLookupError:
            pass
    resumed = start(tmp, out, jobs, "--resume", sleep_s=0)
    _, err = resumed.communicate(timeout=DEADLINE_S)
    assert resumed.returncode == 0, err
    assert finished_points(out) == len(NEW["axes"]["seed"]) and (out / "summary.parquet").is_file()
    assert not [p for p in out.rglob(".tmp-*")], sorted(out.rglob(".tmp-*"))
    if old is not None:  # replaced only by a --force sweep that completes; else the old points are back
        after = tree(out / "points")
        if proc.returncode == 0:
            assert not set(old) & set(after)
        else:
            assert {k: after.get(k) for k in old} == old


def test_a_killed_force_is_put_back_by_the_next_sweep_and_said(tmp_path, capsys):
    """The state SIGKILL leaves mid `--force` (points moved aside, some new ones written) is recovered
    deterministically by whichever sweep comes next."""
    from workbench.sweep.replaced import move_aside

    out = tmp_path / "out"
    run_sweep(parse_spec(OLD), out, executor=LocalExecutor(1), progress=False, run_fn=fake_run)
    old = tree(out / "points")
    move_aside(out)  # what --force does first; then it was killed
    (out / "points").mkdir()
    with pytest.raises(ValueError, match="already holds a sweep"):  # the aside points still count as a sweep
        run_sweep(parse_spec(NEW), out, executor=LocalExecutor(1), progress=False, run_fn=fake_run)
    run_sweep(parse_spec(NEW), out, executor=LocalExecutor(1), progress=False, run_fn=fake_run, resume=True)
    err = capsys.readouterr().err
    assert f"{out}: a --force sweep did not finish; 3 of the points it was replacing are back in {out}/points" in err
    after = tree(out / "points")
    assert {k: after[k] for k in old} == old and not list(out.glob(".tmp-*"))
