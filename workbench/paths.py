"""Where the workbench finds things outside the package: the repository root and shared traces."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent  # meaningful in a source checkout only
IN_CHECKOUT = (REPO_ROOT / "pyproject.toml").is_file()  # False for an installed wheel (site-packages)


def shared_traces_dir() -> Path | None:
    """`../shared/traces` beside the checkout (or $WORKBENCH_SHARED_TRACES), None when absent."""
    candidates = []
    if os.environ.get("WORKBENCH_SHARED_TRACES"):
        candidates.append(Path(os.environ["WORKBENCH_SHARED_TRACES"]))
    candidates += [REPO_ROOT.parent / "shared" / "traces", Path.cwd().parent / "shared" / "traces"]
    for path in candidates:
        if path.is_dir():
            return path
    return None


def runs_dir() -> Path:
    """Where sweeps go when no output directory is named: $WORKBENCH_RUNS_DIR, else `runs` in the working
    directory."""
    return Path(os.environ.get("WORKBENCH_RUNS_DIR") or "runs")
