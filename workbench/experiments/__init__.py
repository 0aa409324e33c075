"""The experiments that ship inside the package (YAML package data): `quickstart` and one `fig_<name>`
sweep per figure. They are found through importlib.resources, so an installed wheel has them too."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def builtin_dir() -> Path:
    return Path(str(files(__name__)))


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
