"""The wheel ships the CUDA sources and the built-in experiments as package data of `workbench`, and an
installed wheel works outside the checkout."""

import os
import subprocess
import sys
import sysconfig
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


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(REPO)], check=True, capture_output=True)
    (path,) = out.glob("*.whl")
    return path


def test_wheel_ships_the_builtin_experiments(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("workbench/experiments/"))
    assert "quickstart.yaml" in shipped and "fig_memory_waste.yaml" in shipped, shipped


@pytest.mark.slow
def test_the_installed_wheel_runs_the_quick_start_outside_the_checkout(wheel, tmp_path):
    """Offline: a fresh venv sees this environment's dependencies through a .pth file, gets only the wheel
    installed (--no-index --no-deps), and runs `python -m workbench.sweep` from an empty directory."""
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "outer_env.pth").write_text("\n".join(sorted(ours)) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "--no-deps",
                    "-q", str(wheel)], check=True, capture_output=True)
    work = tmp_path / "elsewhere"
    work.mkdir()
    # a user's environment: no runs directory chosen (importing workbench.notebook sets one in this process)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WORKBENCH_SHARED_TRACES",
                                                            "WORKBENCH_RUNS_DIR")}
    env.update(MPLBACKEND="Agg", NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    where = subprocess.run([str(python), "-c", "import workbench; print(workbench.__file__)"], cwd=work, env=env,
                           check=True, capture_output=True, text=True).stdout
    assert where.startswith(site), where  # the installed copy, not the checkout
    done = subprocess.run([str(python), "-m", "workbench.sweep", "--no-progress", "-j", "2"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "quickstart: 5 points" in done.stdout
    assert (work / "runs" / "quickstart" / "summary.parquet").is_file()
    assert len(list((work / "runs" / "quickstart" / "points").iterdir())) == 5
