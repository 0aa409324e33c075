"""A sweep's workers never import the caller's `__main__`: a script without an `if __name__ == "__main__":`
guard runs its top level once, not once per worker, however it was started (a file, `python -m`, stdin)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]  # the package under test, wherever the script runs

SPEC = {"name": "no-guard", "base": {"kernel": "none", "num_requests": 3,
                                     "model": "custom:layers=2,kv_heads=2,heads=4,head_dim=16,params_b=0.1,"
                                              "max_model_len=512", "kv_slots": 2048, "workload": "alpaca-like"},
        "axes": {"seed": [1, 2]}}


def script(out) -> str:
    return (f"import workbench as wb\n"
            f"print('top level ran', flush=True)\n"
            f"table = wb.sweep({SPEC!r}, {str(out)!r}, jobs=2, progress=False)\n"
            f"print(len(table), 'points')\n")


@pytest.mark.parametrize("module", [None, "noguard", "workbench.sweep.__main__"])
def test_a_spawned_worker_is_told_to_import_no_main(monkeypatch, tmp_path, module):
    """What a spawned worker imports before anything else (multiprocessing's preparation data) names neither
    the caller's file nor its module while the pool starts, and the caller's `__main__` is whole afterwards."""
    import multiprocessing.spawn
    import types

    from workbench.sweep.executors import _spawnable_main

    script = tmp_path / "noguard.py"  # a script that exists, as a caller's does
    script.write_text("")
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    main.__spec__ = None if module is None else types.SimpleNamespace(name=module)
    monkeypatch.setitem(sys.modules, "__main__", main)
    with _spawnable_main():
        data = multiprocessing.spawn.get_preparation_data("worker")
    assert "init_main_from_path" not in data and "init_main_from_name" not in data
    assert main.__file__ == str(script) and getattr(main.__spec__, "name", None) == module


@pytest.mark.slow  # three interpreters each start a sweep of two spawned workers
@pytest.mark.parametrize("started", ["file", "module", "stdin"])
def test_a_script_without_a_main_guard_runs_its_top_level_once(tmp_path, started):
    (tmp_path / "noguard.py").write_text(script(tmp_path / "out"))
    argv = {"file": [sys.executable, "noguard.py"], "module": [sys.executable, "-m", "noguard"],
            "stdin": [sys.executable, "-"]}[started]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(argv, input=script(tmp_path / "out") if started == "stdin" else None, capture_output=True,
                          text=True, cwd=tmp_path, timeout=600, env=env)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.splitlines() == ["top level ran", "2 points"]
