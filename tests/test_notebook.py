"""`workbench.notebook`, the notebooks' helper: importing it changes no environment variable, and the folder
it gives a notebook's sweeps is absolute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from workbench.paths import REPO_ROOT

PROBE = ("import json, os; import workbench.notebook as nb; "
         "print(json.dumps([os.environ.get('WORKBENCH_RUNS_DIR'), str(nb.runs_dir())]))")


def _probe(tmp_path: Path, **env: str) -> tuple[str | None, Path]:
    base = {k: v for k, v in os.environ.items() if k != "WORKBENCH_RUNS_DIR"}
    base["PYTHONPATH"] = str(REPO_ROOT)
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env={**base, **env}, check=True,
                          capture_output=True, text=True)
    variable, runs_dir = json.loads(done.stdout)
    return variable, Path(runs_dir)


def test_importing_the_helper_sets_no_runs_directory_for_the_process(tmp_path):
    variable, runs_dir = _probe(tmp_path)
    assert variable is None  # a later wb.sweep in the process, or a child process, is not redirected
    assert runs_dir == REPO_ROOT / "runs" / "notebooks" and runs_dir.is_absolute()


def test_the_runs_directory_a_user_names_is_made_absolute(tmp_path):
    variable, runs_dir = _probe(tmp_path, WORKBENCH_RUNS_DIR="mine")
    assert variable == "mine" and runs_dir == tmp_path.resolve() / "mine"
