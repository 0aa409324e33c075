"""The wheel ships the CUDA sources as package data of `workbench` (DESIGN §1)."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_wheel_ships_every_kernel_source(tmp_path):
    sources = sorted(p.name for p in (REPO / "kernels").iterdir() if p.suffix in (".cu", ".cuh", ".h", ".cpp"))
    if not sources:
        pytest.skip("no kernel sources in this checkout")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("workbench/_kernels/"))
    assert shipped == sources
    assert not any(n.startswith("kernels/") for n in names), "no top-level `kernels` package in the wheel"
