"""The sdist carries the top-level `kernels/` and `experiments/`, the wheel built from it ships them as
package data of `workbench` (`_kernels`, `_experiments`), and an installed wheel works outside the checkout."""

import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


KERNEL_SUFFIXES = (".cu", ".cuh", ".h", ".cpp")


def _shipped(folder: str, suffixes: tuple[str, ...]) -> list[str]:
    return sorted(p.name for p in (REPO / folder).iterdir() if p.suffix in suffixes)


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    """The source distribution, built through setuptools' PEP 517 hook as `python -m build --sdist` does."""
    out = tmp_path_factory.mktemp("sdist")
    subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                    "build_meta.build_sdist(sys.argv[1])", str(out)], cwd=REPO, check=True, capture_output=True)
    (path,) = out.glob("*.tar.gz")
    return path


def test_the_sdist_carries_the_kernels_and_the_experiments(sdist):
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    root = names[0].split("/", 1)[0]
    for folder, suffixes in (("kernels", KERNEL_SUFFIXES), ("experiments", (".yaml",))):
        inside = sorted(n.rsplit("/", 1)[1] for n in names
                        if n.startswith(f"{root}/{folder}/") and n.endswith(suffixes))
        assert inside == _shipped(folder, suffixes), folder


@pytest.fixture(scope="module")
def wheel(sdist, tmp_path_factory) -> Path:
    """The wheel built from the sdist (not from the checkout), as `python -m build` builds it."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(sdist)], check=True, capture_output=True)
    (path,) = out.glob("*.whl")
    return path


def test_the_wheel_ships_every_kernel_source(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("workbench/_kernels/"))
    assert shipped == _shipped("kernels", KERNEL_SUFFIXES)
    assert not any(n.startswith("kernels/") for n in names), "no top-level `kernels` package in the wheel"


def test_the_wheel_ships_the_builtin_experiments(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n.rsplit("/", 1)[1] for n in names if n.startswith("workbench/_experiments/"))
    assert shipped == _shipped("experiments", (".yaml",))
    assert "quickstart.yaml" in shipped
    assert not any(n.startswith("experiments/") for n in names), "no top-level `experiments` folder in the wheel"


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> tuple[Path, str, dict[str, str]]:
    """Offline: a fresh venv sees this environment's dependencies through a .pth file and gets only the wheel
    installed (--no-index --no-deps). Returns its python, its site-packages and a user's environment."""
    env_dir = tmp_path_factory.mktemp("installed") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "outer_env.pth").write_text("\n".join(sorted(ours)) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", "--no-deps",
                    "-q", str(wheel)], check=True, capture_output=True)
    # a user's environment: no runs directory chosen, no shared traces beside it
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WORKBENCH_SHARED_TRACES",
                                                            "WORKBENCH_RUNS_DIR")}
    env.update(MPLBACKEND="Agg", NUMBA_CACHE_DIR=str(env_dir.parent / "numba"))
    return python, site, env


def test_the_installed_wheel_finds_its_kernels_and_experiments(installed, tmp_path):
    python, site, env = installed
    found = subprocess.run([str(python), "-c", "import workbench; from workbench.experiments import builtin_dir; "
                            "from workbench.kernels.source import kernels_dir; "
                            "print(workbench.__file__, builtin_dir(), kernels_dir(), sep='\\n')"],
                           cwd=tmp_path, env=env, check=True, capture_output=True, text=True).stdout.split("\n")
    package, experiments, kernels = (Path(line) for line in found[:3])
    assert package.is_relative_to(site), package  # the installed copy, not the checkout
    assert experiments == package.parent / "_experiments" and (experiments / "quickstart.yaml").is_file()
    assert kernels == package.parent / "_kernels"


@pytest.mark.slow
def test_the_installed_wheel_runs_the_quick_start_outside_the_checkout(installed, tmp_path):
    """`python -m workbench.sweep` (the quick start, at its full size) from an empty directory."""
    python, _, env = installed
    work = tmp_path / "elsewhere"
    work.mkdir()
    done = subprocess.run([str(python), "-m", "workbench.sweep", "--no-progress", "-j", "2"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "quickstart: 5 points" in done.stdout
    assert (work / "runs" / "quickstart" / "summary.parquet").is_file()
    assert len(list((work / "runs" / "quickstart" / "points").iterdir())) == 5
