"""benchmarks/gpu_check.sh cannot mislead: its first step names every module the GPU steps import (read from
the sources) and stops with its own verdict and exit status when one is missing, instead of the tests failing
at collection and reading as a kernel failure."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_imports", REPO / "benchmarks" / "gpu_imports.py")
gpu_imports = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_imports)


def test_the_gpu_steps_import_these_modules_and_no_others():
    """What a GPU image needs; a new import on the GPU path (pandas, tqdm, ...) shows up here first."""
    assert set(gpu_imports.external_imports()) == {"cuda.bindings", "cupy", "llvmlite", "numba", "numpy", "pytest"}


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_import_closure_follows_the_package_and_leaves_out_optional_imports(tmp_path):
    _write(tmp_path, {
        "tests/test_gpu.py": ("import pytest\nfrom helper import case\nfrom workbench import kernels\n"
                              "cp = pytest.importorskip('cupyish')\n"),
        "tests/helper.py": "import numpyish\n",
        "tests/conftest.py": "import json\n\ndef fixture():\n    import tqdmish\n",
        "workbench/__init__.py": "",
        "workbench/kernels/__init__.py": ("import importlib\nBACKENDS = {'x': 'workbench.kernels.backend'}\n"
                                          "try:\n    import optionalish\nexcept ImportError:\n    pass\n"),
        "workbench/kernels/backend.py": "def run():\n    import numbaish.extending\n    from numbaish import njit\n",
    })
    found = gpu_imports.external_imports(roots=("tests/test_gpu.py",), collected=("tests/conftest.py",),
                                         repo=tmp_path)
    assert found == {"pytest": {"tests/test_gpu.py"}, "cupyish": {"tests/test_gpu.py"},
                     "numpyish": {"tests/helper.py"}, "numbaish": {"workbench/kernels/backend.py"}}


@pytest.mark.skipif(shutil.which("timeout") is None, reason="gpu_check.sh needs coreutils' timeout")
def test_a_python_without_the_modules_stops_the_check_at_env(tmp_path):
    """The rehearsal on a bare Python: `python -S` sees the standard library only."""
    bare = tmp_path / "bare-python"
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(0o755)
    out = tmp_path / "check"
    env = {**os.environ, "PYTHON": str(bare)}
    result = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), str(out)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == gpu_imports.MISSING_EXIT, result.stdout + result.stderr
    verdicts = (out / "verdict.txt").read_text().splitlines()
    assert len(verdicts) == 1 and verdicts[0].split()[:2] == ["environment", "ENV"]
    assert "cupy" in verdicts[0] and "numpy" in verdicts[0] and "pytest" in verdicts[0]
    assert "== 2." not in result.stdout  # nothing after the environment ran
