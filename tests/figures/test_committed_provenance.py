"""The committed provenance sidecars (figures/*.provenance.json) name the repository's files relative to it
and never one machine's folders, and `python -m workbench.figures` records its command so."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from workbench.figures.__main__ import recorded_command
from workbench.figures.registry import experiment_path
from workbench.paths import REPO_ROOT

SIDECARS = sorted((REPO_ROOT / "figures").glob("*.provenance.json"))
MACHINE_PATH = re.compile(r"^(/|~|[A-Za-z]:[\\/]|\\\\)")  # POSIX root, home, a Windows drive or share


def _strings(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


@pytest.mark.parametrize("sidecar", SIDECARS, ids=lambda p: p.stem)
def test_a_committed_sidecar_names_no_machine_path(sidecar):
    record = json.loads(sidecar.read_text())
    words = [w for s in _strings(record) for w in (shlex.split(s) if " " in s else [s])]
    for word in words:
        value = word.partition("=")[2] if word.startswith("--") else word
        assert not MACHINE_PATH.match(value), f"{sidecar.name}: {word!r} is one machine's path"
    assert (REPO_ROOT / record["experiment"]) == experiment_path(record["figure"])


def test_there_are_committed_sidecars():
    assert len(SIDECARS) >= 10


def test_the_recorded_command_keeps_folders_inside_the_repository_only(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    assert recorded_command(["fleet", "--runs-dir", str(tmp_path / "runs"), "-j", "2"]) == \
        "python -m workbench.figures fleet -j 2"
    assert recorded_command(["--runs-dir=/elsewhere", "--figures-dir", "figures", "sharing"]) == \
        "python -m workbench.figures --figures-dir figures sharing"
    assert recorded_command(["--figures-dir", str(REPO_ROOT / "figures"), "--runs-dir", "runs/x"]) == \
        "python -m workbench.figures --figures-dir figures --runs-dir runs/x"
