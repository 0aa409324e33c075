"""Path kinds, fuzzed (hypothesis): `--out` of `python -m workbench.run` and of `python -m workbench.sweep` as a
missing path, an empty or a full directory, a file, a symbolic link to each of those, a dangling link, a link
loop, a path below a file, and (sweeps) a directory whose `.lock`, `broken`, `points` or `summary.parquet` is of
the wrong kind. Either the result is complete where the path leads and nothing else changed, or the refusal is
one line, exit 2, before any simulation, and nothing changed at all."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import call_cli as call
from tests.sweep.sweep_fake_engine import SerialExecutor as Serial
from tests.sweep.sweep_fake_engine import fake_run
from workbench.engine import simulation as engine
from workbench.run import main as run_main
from workbench.sweep import cli as sweep_cli
from workbench.sweep import parse_spec, run_sweep

PATH_EXAMPLES = 40
SLOW_PATH_EXAMPLES = 100  # deselect with -m "not slow"
TINY = ["--model", "custom:layers=2,kv_heads=2,heads=4,head_dim=16,max_model_len=512", "--kv-slots", "2048",
        "--kernel", "none", "--workload", "fixed:prompt=8,output=4", "--num-requests", "3"]
SPEC = {"name": "paths", "axes": {"seed": [0, 1]}}


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under root, links not followed: file bytes, directories, link targets."""
    found: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = ("link", os.readlink(path))
            elif path.is_dir():
                found[key] = "dir"
            else:
                found[key] = path.read_bytes()
    return found


def make(root: Path, kind: str, tool: str) -> Path:
    """An --out of the given kind under root (which it may fill with other entries)."""
    out = root / "out"
    full = root / "full"
    full.mkdir()
    if tool == "run":
        (full / "summary.json").write_text("an earlier run\n")
    else:
        run_sweep(parse_spec(SPEC), full, executor=Serial(), progress=False, run_fn=fake_run)
    if kind == "empty-dir":
        out.mkdir()
    elif kind == "full-dir":
        return full
    elif kind == "file":
        out.write_text("a file\n")
    elif kind == "below-a-file":
        out.write_text("a file\n")
        return out / "sub"
    elif kind.startswith("link-to-"):
        target = {"link-to-empty-dir": root / "empty", "link-to-full-dir": full, "link-to-file": root / "a-file",
                  "link-to-missing": root / "missing", "link-to-missing-parent": root / "no" / "where"}[kind]
        if kind == "link-to-empty-dir":
            target.mkdir()
        elif kind == "link-to-file":
            target.write_text("a file\n")
        out.symlink_to(target)
    elif kind == "link-loop":
        out.symlink_to(root / "loop")
        (root / "loop").symlink_to(out)
    elif kind.startswith("bad-entry:"):
        name, wrong = kind.split(":")[1:]
        out.mkdir()
        if wrong == "dir":
            (out / name).mkdir()
        elif wrong == "file":
            (out / name).write_text("x")
        else:
            (out / name).symlink_to(root / "elsewhere")
    return out


KINDS = ["missing", "empty-dir", "full-dir", "file", "below-a-file", "link-to-empty-dir", "link-to-full-dir",
         "link-to-file", "link-to-missing", "link-to-missing-parent", "link-loop"]
SWEEP_KINDS = [f"bad-entry:{name}:{wrong}" for name in (".lock", "summary.parquet") for wrong in ("dir", "link")]
SWEEP_KINDS += [f"bad-entry:{name}:{wrong}" for name in ("points", "broken") for wrong in ("file", "link")]


CASES = st.one_of(st.tuples(st.just("run"), st.sampled_from(KINDS)),
                  st.tuples(st.just("sweep"), st.sampled_from(KINDS + SWEEP_KINDS)))
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@settings(SETTINGS, max_examples=PATH_EXAMPLES)
@given(case=CASES, force=st.booleans())
def test_out_of_any_kind_gives_a_result_where_it_leads_or_one_line_before_any_work(tmp_path_factory, monkeypatch,
                                                                                  case, force):
    out_of_kind(tmp_path_factory, monkeypatch, case, force)


@pytest.mark.slow
@settings(SETTINGS, max_examples=SLOW_PATH_EXAMPLES)
@given(case=CASES, force=st.booleans())
def test_out_of_every_kind_many_times(tmp_path_factory, monkeypatch, case, force):
    out_of_kind(tmp_path_factory, monkeypatch, case, force)


def out_of_kind(tmp_path_factory, monkeypatch, case: tuple[str, str], force: bool) -> None:
    tool, kind = case
    root = tmp_path_factory.mktemp("paths")
    out = make(root, kind, tool)
    started = []
    if tool == "run":
        real = engine.run_in_memory
        monkeypatch.setattr(engine, "run_in_memory", lambda *a, **k: started.append(1) or real(*a, **k))
        main, argv = run_main, [*TINY, "--out", str(out)]
    else:
        def recorded_run(cfg, out_dir):
            started.append(1)
            return fake_run(cfg, out_dir)

        real_sweep = sweep_cli.run_sweep
        monkeypatch.setattr(sweep_cli, "run_sweep", lambda *a, **k: real_sweep(
            *a, **{**k, "run_fn": recorded_run, "executor": Serial()}))
        spec = root.parent / f"{root.name}.yaml"
        spec.write_text(json.dumps({**SPEC, "axes": {"seed": [5, 6]}}))
        main, argv = sweep_cli.main, [str(spec), "--out", str(out), "--no-progress"]
    before = snapshot(root)
    status, err = call(main, [*argv, *(["--force"] if force else [])])
    event(f"{tool} {kind}: exit {status}")
    assert "Traceback" not in err
    if status == 2:
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert not started, "refused only after the work had started"
        assert snapshot(root) == before
        return
    assert status == 0, err
    where = out.resolve()
    if tool == "run":
        assert sorted(p.name for p in where.iterdir()) == ["config.json", "requests.parquet", "steps.parquet",
                                                           "summary.json"]
    else:
        assert (where / "summary.parquet").is_file() and len(list((where / "points").iterdir())) >= 2
    after = snapshot(root)
    rel = str(where.relative_to(root))
    untouched = {k: v for k, v in before.items() if k != rel and not k.startswith(rel + os.sep)}
    assert {k: after.get(k) for k in untouched} == untouched  # the link itself and everything beside it
    assert not [k for k in after if ".tmp-" in k], sorted(after)


@pytest.mark.parametrize("kind", ["link-loop", "file", "below-a-file"])
def test_the_unusable_kinds_are_refused(tmp_path, monkeypatch, kind, capsys):
    out = make(tmp_path, kind, "run")
    monkeypatch.setattr(engine, "run_in_memory", lambda *a, **k: pytest.fail("simulated before checking --out"))
    assert run_main([*TINY, "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out {out}")


def test_a_link_to_a_directory_is_written_through_and_kept(tmp_path):
    out = make(tmp_path, "link-to-empty-dir", "run")
    assert run_main([*TINY, "--out", str(out)]) == 0
    assert out.is_symlink() and (tmp_path / "empty" / "summary.json").is_file()
    assert run_main([*TINY, "--seed", "3", "--out", str(out), "--force"]) == 0  # replaced through the link
    assert out.is_symlink() and json.loads((tmp_path / "empty" / "config.json").read_text())["seed"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "full", "out"]
