"""The built-in experiments: `quickstart`, one `fig_<name>` sweep per figure and the paper's `paper_<name>`.
Their YAML files live in the repository's top-level `experiments/`; the wheel ships them as
`workbench/_experiments` (setup.py), so an installed package finds them too."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from workbench.paths import PACKAGE_DIR, REPO_ROOT

MARKER = "quickstart.yaml"  # every copy of the folder holds it; another folder named `experiments` may not


@cache
def builtin_dir() -> Path:
    """The folder of the built-in experiments: the checkout's `experiments/` first, else the wheel's
    `workbench/_experiments/`."""
    for candidate in (REPO_ROOT / "experiments", PACKAGE_DIR / "_experiments"):
        if (candidate / MARKER).is_file():
            return candidate
    raise FileNotFoundError(f"the built-in experiments are missing: looked for {MARKER} in "
                            f"{REPO_ROOT / 'experiments'} (source checkout) and {PACKAGE_DIR / '_experiments'} "
                            f"(installed wheel)")


def builtin_names() -> list[str]:
    return sorted(p.stem for p in builtin_dir().glob("*.yaml"))


def find_experiment(arg: str | Path) -> Path:
    """A sweep YAML: the user's file when `arg` is an existing path, else the built-in experiment of that
    name (`fig_sharing`, `fig_sharing.yaml` and `experiments/fig_sharing.yaml` all name the same one).
    An unknown name comes back as given, so that reading it reports the path the user typed."""
    path = Path(arg)
    if path.is_file():
        return path
    builtin = builtin_dir() / f"{path.name.removesuffix('.yaml')}.yaml"
    return builtin if builtin.is_file() else path
