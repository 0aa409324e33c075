"""The public API: `workbench.run` is the command line's run in memory (same checks, same messages, same
files), `workbench.sweep` the sweep command's, and the listings are the registries."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from html import escape as html_escape

import pandas as pd
import pytest

import workbench as wb
from tests.engine.conftest import SMALL_MODEL
from workbench.allocators import registry
from workbench.config import RunConfig
from workbench.presets import GPUS, MODELS
from workbench.run import main as run_main
from workbench.run_table import summary_rows
from workbench.traces.registry import TRACES

# 256 bytes per slot: 2^-11 GiB = 2048 slots
TINY = {"model": SMALL_MODEL, "kv_gib": 2**-11, "kernel": "none", "workload": "alpaca-like", "num_requests": 12,
        "rate": 10.0}
WALL_KEYS = ("sim_wall_s",)  # the one figure of a run that depends on the machine's speed


def argv_of(flags: dict) -> list[str]:
    """The command line of `flags`: `--kv-gib 0.00048828125`, a switch when true."""
    argv = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv += [flag] if value else []
        else:
            argv += [flag, str(value)]
    return argv


def tree(path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_the_command_and_the_call_write_the_same_result(tmp_path, capsys):
    flags = {**TINY, "strategy": "paged-prefix", "workload": "system-prompt:k=2,system=128", "seed": 3}
    assert run_main([*argv_of(flags), "--out", str(tmp_path / "cli")]) == 0
    printed = capsys.readouterr().out
    result = wb.run(**flags)
    assert result.save(tmp_path / "api") == (tmp_path / "api").resolve()
    cli, api = tmp_path / "cli", tmp_path / "api"
    for table in ("steps.parquet", "requests.parquet"):
        pd.testing.assert_frame_equal(pd.read_parquet(cli / table), pd.read_parquet(api / table))
    assert json.loads((cli / "config.json").read_text()) == json.loads((api / "config.json").read_text())
    cli_summary, api_summary = (json.loads((d / "summary.json").read_text()) for d in (cli, api))
    assert list(cli_summary) == list(api_summary)
    assert {k: v for k, v in cli_summary.items() if k not in WALL_KEYS} == \
           {k: v for k, v in api_summary.items() if k not in WALL_KEYS}
    # the printed table is the Result's repr, but for the wall time
    wall = [name for name, _ in summary_rows(api_summary) if name.startswith("wall time")][0]
    assert [line for line in printed.splitlines() if not line.startswith((wall, "wrote "))] == \
           [line for line in repr(result).splitlines() if not line.startswith(wall)]


def test_the_result_holds_the_tables_in_memory():
    result = wb.run(**TINY)
    assert len(result.requests) == TINY["num_requests"] and len(result.steps) > 0
    assert result.metrics["num_finished"] + result.metrics["num_rejected"] == TINY["num_requests"]
    assert len(result.summary) == 1
    row = result.summary.iloc[0]
    for key, value in result.metrics.items():
        assert row[key] == value or (pd.isna(value) and pd.isna(row[key])), key
    assert row["strategy"] == "paged" and row["config_num_requests"] == TINY["num_requests"]
    html = result._repr_html_()
    for name, value in summary_rows(result.metrics):
        assert f"{html_escape(name)}</th><td style='text-align:left'>{html_escape(value)}</td>" in html
    assert repr(result).startswith(result.title)
    with pytest.warns(DeprecationWarning, match="Result.metrics"):
        assert result.figures is result.metrics  # the former name, for one release


BAD_FLAGS = [
    {"block_size": 0},
    {"strategy": "nope"},
    {"kv_slots": 100, "kv_gib": None},
    {"n": 2, "beam_width": 3},
    {"kernel": "none", "verify_every": 1},
    {"eff_bw": 1.5},
    {"max_model_len": 3},
    {"workload": "nonsense-name"},
    {"workload": "fixed:prompt=0"},
    {"block_size": 4096},
    {"prefill_replicas": 1},
    # found once the workload is read: no request fits the pool
    {"workload": "fixed:prompt=600,output=10"},
]


@pytest.mark.parametrize("bad", BAD_FLAGS, ids=lambda bad: ",".join(bad))
def test_a_bad_flag_is_the_same_error_from_the_command_and_the_call(bad, capsys, tmp_path):
    flags = {k: v for k, v in {**TINY, **bad}.items() if v is not None}
    assert run_main([*argv_of(flags), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    with pytest.raises(wb.ConfigError) as raised:
        wb.run(**flags)
    assert err == f"error: {raised.value}\n"
    assert raised.value.__cause__ is None and raised.value.__suppress_context__  # one error, not a chain
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_flag_names_the_nearest_one():
    with pytest.raises(wb.ConfigError, match="unknown flag 'kvgib'; did you mean kv_gib"):
        wb.run(kvgib=1)
    with pytest.raises(wb.ConfigError, match="unknown flag 'colour'; workbench.flags"):
        wb.run(colour="red")


def test_save_refuses_results_as_out_does(tmp_path):
    result = wb.run(**TINY)
    out = tmp_path / "run"
    result.save(out)
    first = tree(out)
    assert sorted(first) == ["config.json", "requests.parquet", "steps.parquet", "summary.json"]
    other = wb.run(**{**TINY, "seed": 5})
    with pytest.raises(wb.ConfigError, match=f"save: {out} already holds results; pass force=True to replace it"):
        other.save(out)
    assert tree(out) == first
    (tmp_path / "file").write_text("x")
    with pytest.raises(wb.ConfigError, match="exists and is not a directory"):
        other.save(tmp_path / "file")
    other.save(out, force=True)
    assert json.loads((out / "config.json").read_text())["seed"] == 5
    back = wb.load(out)  # read back: the same tables and figures
    pd.testing.assert_frame_equal(back.steps, other.steps)
    pd.testing.assert_frame_equal(back.requests, other.requests)
    pd.testing.assert_frame_equal(back.summary, other.summary)
    assert back.config == other.config
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "run"]  # no temporary or replaced copy


SPEC = {"name": "api-sweep", "base": TINY, "axes": {"strategy": ["contiguous-max", "paged"]}}


def test_a_sweep_resumes_and_its_rows_are_the_results(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_RUNS_DIR", str(tmp_path / "runs"))
    table = wb.sweep(SPEC, jobs=1, progress=False)
    out = tmp_path / "runs" / "api-sweep"
    assert (out / "summary.parquet").is_file() and list(table["strategy"]) == ["contiguous-max", "paged"]
    points = {p.name: p.stat().st_mtime_ns for p in (out / "points").iterdir()}
    again = wb.sweep(SPEC, jobs=1, progress=False)  # resumed: no point runs again
    assert {p.name: p.stat().st_mtime_ns for p in (out / "points").iterdir()} == points
    pd.testing.assert_frame_equal(table, again)
    # a run's summary row is the sweep's row of the same configuration
    for strategy in ("contiguous-max", "paged"):
        row = wb.run(**{**TINY, "strategy": strategy}).summary
        swept = table[table["strategy"] == strategy].reset_index(drop=True)
        assert list(row.columns) == list(swept.columns)
        pd.testing.assert_frame_equal(row.drop(columns=list(WALL_KEYS)), swept.drop(columns=list(WALL_KEYS)),
                                      check_dtype=False)
    # a point of it, read back whole: the tables of the same run in memory
    paged = table[table["strategy"] == "paged"]
    kept = wb.point(paged, paged["point_id"].item())
    fresh = wb.run(**{**TINY, "strategy": "paged"})
    pd.testing.assert_frame_equal(kept.steps, fresh.steps)
    pd.testing.assert_frame_equal(kept.requests, fresh.requests)
    assert kept.config == fresh.config and kept.description == json.loads(json.dumps(fresh.description))
    with pytest.raises(ValueError, match="not in this table"):
        wb.point(paged, table["point_id"].iloc[0])
    with pytest.raises(ValueError, match="does not say where its sweep is"):
        wb.point(fresh.summary, fresh.summary["point_id"].item())
    with pytest.raises(wb.ConfigError, match="already holds a sweep; pass --resume"):
        wb.sweep(SPEC, resume=False, progress=False)
    with pytest.raises(wb.ConfigError, match="strategy"):
        wb.sweep({**SPEC, "axes": {"strategy": ["nope"]}}, tmp_path / "other", progress=False)
    assert not (tmp_path / "other").exists()


def test_a_sweep_runs_from_a_script_read_from_stdin(tmp_path):
    # `python -` names its __main__ file '<stdin>', which spawned workers would try to run and die of
    script = (f"import workbench as wb\n"
              f"table = wb.sweep({SPEC!r}, {str(tmp_path / 'out')!r}, jobs=2, progress=False)\n"
              f"print(sorted(table['strategy']))\n")
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, cwd=tmp_path,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['contiguous-max', 'paged']"


def test_a_sweep_takes_a_yaml_file(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps({**SPEC, "axes": {"strategy": ["paged"]}}))  # JSON is YAML
    table = wb.sweep(path, tmp_path / "out", jobs=1, progress=False)
    assert list(table["strategy"]) == ["paged"] and (tmp_path / "out" / "summary.parquet").is_file()


def test_the_listings_are_the_registries():
    assert list(wb.strategies().index) == registry.names()
    assert wb.strategies().loc["paged-prefix", "prefix_cache"]
    assert wb.strategies()["description"].str.len().gt(0).all()
    models = wb.models()
    assert list(models.index) == list(MODELS)
    for name, preset in MODELS.items():
        assert models.loc[name, "kv_bytes_per_token_fp16"] == preset.kv_bytes_per_token("fp16")
        assert models.loc[name, "num_layers"] == preset.num_layers
    gpus = wb.gpus()
    assert list(gpus.index) == list(GPUS)
    assert all(gpus.loc[n, "hbm_gb_s"] == g.hbm_gb_s for n, g in GPUS.items())
    traces = wb.traces()
    assert list(traces.index) == list(TRACES)
    for name, entry in TRACES.items():  # the value that replays it, none where no reader takes the file
        assert traces.loc[name, "workload"] == f"{entry.format}:{name}" if entry.format else \
            pd.isna(traces.loc[name, "workload"])
    flags = wb.flags()
    assert list(flags.index) == RunConfig.field_names()
    assert all(flags.loc[f.name, "default"] == f.default or f.default is None for f in dataclasses.fields(RunConfig))


def test_import_is_cheap_and_the_names_call_whichever_python_binds():
    code = ("import sys, workbench\n"
            "assert not [m for m in sys.modules if m.startswith(('workbench.', 'pandas', 'numpy'))], sys.modules\n"
            "import workbench.run, workbench.sweep.cli, workbench.traces\n"  # the modules bound to the names
            "assert callable(workbench.run) and callable(workbench.sweep) and callable(workbench.traces)\n"
            "assert workbench.run.main and workbench.sweep.cli.main and workbench.traces.TRACES\n"
            "print(len(workbench.traces()), len(workbench.strategies()))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(len(TRACES)), str(len(registry.names()))]


def test_the_sweep_command_and_the_call_give_the_same_table_and_errors(tmp_path, capsys):
    from workbench.sweep.cli import main as sweep_main

    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps(SPEC))
    assert sweep_main([str(spec), "--out", str(tmp_path / "cli"), "-j", "1", "--no-progress"]) == 0
    capsys.readouterr()
    table = wb.sweep(spec, tmp_path / "api", jobs=1, progress=False)
    cli = pd.read_parquet(tmp_path / "cli" / "summary.parquet")
    pd.testing.assert_frame_equal(cli.drop(columns=list(WALL_KEYS)), table.drop(columns=list(WALL_KEYS)))
    for bad in ({**SPEC, "axes": {"strategy": ["nope"]}}, {**SPEC, "base": {**TINY, "block_size": 0}},
                {**SPEC, "colour": 1}):
        spec.write_text(json.dumps(bad))
        assert sweep_main([str(spec), "--out", str(tmp_path / "bad"), "--no-progress"]) == 2
        err = capsys.readouterr().err
        with pytest.raises(wb.ConfigError) as raised:
            wb.sweep(spec, tmp_path / "bad", progress=False)
        assert err == f"error: {raised.value}\n"
    assert sweep_main([str(tmp_path / "cli" / "nothing.yaml"), "--out", str(tmp_path / "cli")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert not (tmp_path / "bad").exists()
