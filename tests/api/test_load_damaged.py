"""`workbench.load` of a damaged result directory: every damage to any of its four files is one ResultError
naming that file, raised before a Result exists, so a Result that loads also displays."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import workbench as wb
from tests.api.test_public_api import TINY
from workbench.errors import ResultError
from workbench.result_dir import RUN_FILES


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("run") / "run"
    wb.run(**TINY).save(path)
    return path


def _cut(fraction):
    return lambda p: p.write_bytes(p.read_bytes()[:int(len(p.read_bytes()) * fraction)])


DAMAGES = {
    "missing": lambda p: p.unlink(),
    "empty": lambda p: p.write_bytes(b""),
    "garbage": lambda p: p.write_bytes(b"\x00\xff garbage \x80"),
    "cut 1/3": _cut(1 / 3),
    "cut 9/10": _cut(0.9),
    "a JSON list": lambda p: p.write_text("[1, 2]"),
    "an empty JSON object": lambda p: p.write_text("{}"),
    "a directory": lambda p: (p.unlink(), p.mkdir()),
    "a FIFO nobody writes": lambda p: (p.unlink(), os.mkfifo(p)),
    "deep JSON": lambda p: p.write_text("[" * 100_000 + "]" * 100_000),
}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("name", RUN_FILES)
def test_a_damaged_file_is_one_error_naming_it(saved, tmp_path, name, damage):
    folder = tmp_path / "run"
    shutil.copytree(saved, folder)
    DAMAGES[damage](folder / name)
    with pytest.raises(ResultError) as caught:
        wb.load(folder)
    assert caught.value.name == name and f"{folder}/{name} " in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("key", ["config", "summary"])
def test_a_summary_or_config_missing_one_key_is_refused(saved, tmp_path, key):
    for victim in (json.loads((saved / f"{key}.json").read_text()).keys() if key == "summary" else
                   json.loads((saved / "config.json").read_text())["config"].keys()):
        folder = tmp_path / f"run-{victim}"
        shutil.copytree(saved, folder)
        data = json.loads((folder / f"{key}.json").read_text())
        (data if key == "summary" else data["config"]).pop(victim)
        (folder / f"{key}.json").write_text(json.dumps(data))
        if key == "config":  # a flag left out takes its default: a valid configuration
            assert wb.load(folder).config is not None
            continue
        with pytest.raises(ResultError, match=f"summary.json lacks {victim}"):
            wb.load(folder)


def test_a_whole_directory_loads_and_displays(saved):
    result = wb.load(saved)
    assert result.title in repr(result) and result._repr_html_()


def test_a_path_that_is_no_directory_is_refused(saved, tmp_path):
    with pytest.raises(ResultError, match="is not a directory"):
        wb.load(tmp_path / "nothing")
    with pytest.raises(ResultError, match="is not a directory"):
        wb.load(saved / "summary.json")
