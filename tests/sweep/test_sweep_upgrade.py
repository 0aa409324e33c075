"""A sweep survives an upgrade: a point's id names only the fields that differ from their defaults, so a new
field with a default renames nothing; a resumed sweep runs again, and says why, the points that another
package version or git commit made, unless --reuse-stale."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from sweep_fake_engine import SerialExecutor, fake_run

from workbench.code_version import code_version
from workbench.config import RunConfig
from workbench.sweep import config_id, parse_spec, run_sweep
from workbench.sweep import runner as runner_module
from workbench.sweep import spec as spec_module
from workbench.sweep.__main__ import run as main
from workbench.sweep.spec import POINT_ID_HEX

SPEC = {"name": "upgrade", "base": {"block_size": 32}, "axes": {"seed": [0, 1, 2]}}


def sweep(out: Path, **kwargs):
    return run_sweep(parse_spec(SPEC), out, executor=SerialExecutor(), progress=False, run_fn=fake_run, **kwargs)


def runs_logged(monkeypatch, tmp_path) -> Path:
    log = tmp_path / "log"
    log.mkdir()
    monkeypatch.setenv("SWEEP_FAKE_LOG_DIR", str(log))
    return log


def ran(log: Path) -> list[str]:
    return sorted(p.name.split("-")[0] for p in log.iterdir())


def _hash(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:POINT_ID_HEX]


def test_the_id_hashes_only_the_fields_that_differ_from_their_defaults():
    assert config_id(RunConfig()) == _hash({})
    assert config_id(RunConfig(block_size=32, seed=3)) == _hash({"block_size": 32, "seed": 3})
    assert config_id(RunConfig(block_size=16)) == config_id(RunConfig())  # 16 is the default


def test_a_field_added_with_its_default_reruns_nothing(tmp_path, monkeypatch):
    log = runs_logged(monkeypatch, tmp_path)
    out = tmp_path / "out"
    before = sweep(out)
    assert len(ran(log)) == 3

    # the next release: RunConfig has one more field, whose default keeps today's behaviour
    @dataclasses.dataclass(frozen=True)
    class NextRunConfig(RunConfig):
        new_knob_frac: float = 0.0

    for module in (spec_module, runner_module):
        monkeypatch.setattr(module, "RunConfig", NextRunConfig)
    after = sweep(out, resume=True)
    assert len(ran(log)) == 3, "no point ran again"
    assert list(after["point_id"]) == list(before["point_id"])
    assert "new_knob_frac" not in json.loads((out / "points" / before["point_id"][0] / "config.json").read_text())


def _made_by_other_code(folder: Path) -> dict:
    description = json.loads((folder / "config.json").read_text())
    old = {**description, "git_commit": "0123456789abcdef" * 2 + "01234567"}
    (folder / "config.json").write_text(json.dumps(old))
    return old


def test_resume_runs_again_the_points_other_code_made_and_says_why(tmp_path, monkeypatch, capsys):
    log = runs_logged(monkeypatch, tmp_path)
    out = tmp_path / "out"
    ids = list(sweep(out)["point_id"])
    old = _made_by_other_code(out / "points" / ids[1])
    capsys.readouterr()
    sweep(out, resume=True)
    assert ran(log) == sorted(ids + [ids[1]]), "exactly the stale point ran again"
    err = capsys.readouterr().err
    assert "resume: running 1 of 3 points again: they were made by other code" in err
    assert "1 by version 0.1.0 at commit 0123456789ab" in err and "--reuse-stale" in err
    [aside] = (out / "stale").iterdir()  # the old point is kept, not deleted
    assert aside.name.startswith(ids[1]) and json.loads((aside / "config.json").read_text()) == old
    now = json.loads((out / "points" / ids[1] / "config.json").read_text())
    assert (now["version"], now["git_commit"]) == (code_version()["version"], code_version()["git_commit"])


def test_reuse_stale_keeps_the_points_other_code_made(tmp_path, monkeypatch, capsys):
    log = runs_logged(monkeypatch, tmp_path)
    out = tmp_path / "out"
    ids = list(sweep(out)["point_id"])
    old = _made_by_other_code(out / "points" / ids[1])
    capsys.readouterr()
    sweep(out, resume=True, reuse_stale=True)
    assert ran(log) == sorted(ids)
    assert "other code" not in capsys.readouterr().err and not (out / "stale").exists()
    assert json.loads((out / "points" / ids[1] / "config.json").read_text()) == old


def test_a_point_that_records_no_version_is_stale(tmp_path, monkeypatch, capsys):
    log = runs_logged(monkeypatch, tmp_path)
    out = tmp_path / "out"
    ids = list(sweep(out)["point_id"])
    folder = out / "points" / ids[0]
    (folder / "config.json").write_text(json.dumps({"config": json.loads((folder / "config.json").read_text())
                                                    ["config"]}))
    capsys.readouterr()
    sweep(out, resume=True)
    assert ran(log) == sorted(ids + [ids[0]])
    assert "1 by code that recorded no version" in capsys.readouterr().err


def test_the_cli_takes_reuse_stale_only_with_resume(tmp_path, capsys):
    experiment = tmp_path / "e.yaml"
    experiment.write_text(json.dumps(SPEC))
    with pytest.raises(SystemExit) as exit_:
        main([str(experiment), "--out", str(tmp_path / "out"), "--reuse-stale"])
    assert exit_.value.code == 2
    assert "--reuse-stale says which points --resume keeps: pass it with --resume" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
