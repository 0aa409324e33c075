"""Hostile input, fuzzed (hypothesis): whatever the flags of `python -m workbench.run` or the values of a sweep
YAML, the outcome is either a complete, consistent result (exit 0) or exactly one line on stderr with exit
status 2, no traceback, and nothing written or removed."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numba
import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import call_cli as call
from workbench import columns as C
from workbench.allocators import registry
from workbench.engine import run
from workbench.errors import UnservableError
from workbench.results import summary_problem
from workbench.run import main as run_main
from workbench.sweep import SpecError, load_spec
from workbench.sweep.__main__ import run as sweep_main

RUN_EXAMPLES = 250  # 250 + 125 examples in 20-40 s on a shared core: most are refused in milliseconds
MODEL = "custom:layers=2,kv_heads=2,heads=4,head_dim=16,params_b=0.1,max_model_len=512"
BASE = {"model": MODEL, "kv_slots": 2048, "kernel": "none", "workload": "alpaca-like", "num_requests": 12,
        "rate": 20.0}

# Values a hostile tester would try, as text: plausible ones, limits, non-finite and non-numbers.
GARBAGE = st.sampled_from(["", "abc", "1e", "0x10", "--", "1,5", " "])
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.sampled_from(["0", "-0.0", "1e-300", "1e308", "0.5", "1", "2"]))
INTS = st.sampled_from([-(2**64), -1, 0, 1, 2, 3, 5, 8, 16, 2**31 - 1, 2**31, 2**63 - 1, 2**63]).map(str)
FLAGS = {
    "strategy": st.sampled_from([*registry.names(), "bogus"]),
    "model": st.sampled_from([MODEL, "opt-13b", "nope", "custom:layers=2,kv_heads=2,head_dim=16,params_b=inf",
                              "custom:layers=1e30,kv_heads=2,head_dim=16",
                              "custom:layers=2,kv_heads=2,head_dim=16,heads=3",
                              "custom:layers=2,kv_heads=1,head_dim=8,max_model_len=64"]),
    "gpu": st.sampled_from(["a100-40gb", "h200", "nope"]),
    "block-size": st.one_of(INTS, st.sampled_from(["1", "16", "3000"])),
    "fit": st.sampled_from(["first", "best", "buddy", "worst"]),
    "kv-dtype": st.sampled_from(["fp32", "fp16", "bf16", "fp8", "int4"]),
    "kv-gib": st.one_of(FLOATS, st.sampled_from(["0.0005", "1e9"])),
    "kv-slots": st.sampled_from(["-5", "0", "1", "100", "600", "2048", "65536", str(2**31), str(2**40)]),
    "max-model-len": st.sampled_from(["-1", "1", "2", "3", "5", "6", "25", "26", "100", "512", "4096", "10000000"]),
    "workload": st.sampled_from(["alpaca-like", "sharegpt-like", "fixed:prompt=4,output=4",
                                 "system-prompt:k=2,system=16", "multi-turn:turns=2", "fixed:prompt=0",
                                 "fixed:prompt=600,output=10", "nope",
                                 "alpaca-like:cv=inf", "alpaca-like:cv=1e300", "alpaca-like:cv=1e-300",
                                 "multi-turn:think=1e300", "fixed:prompt=99999999999999999999",
                                 "azure:/no/such/file"]),
    "rate": FLOATS,
    "num-requests": st.sampled_from(["-1", "0", "1", "7", "30", str(10**8), str(2**63)]),
    "duration": FLOATS,
    "seed": INTS,
    "clock": st.sampled_from(["roofline", "measured", "wall"]),
    "kernel": st.sampled_from(["none", "none", "numba", "gpu"]),
    "kernel-every": INTS,
    "kernel-heads": st.sampled_from(["0", "1", "2", "3"]),
    "verify-every": st.sampled_from(["-1", "0", "1", "4"]),
    "preemption": st.sampled_from(["recompute", "swap", "drop"]),
    "swap-gib": FLOATS,
    "max-num-seqs": st.sampled_from(["0", "1", "4", "256", str(2**31)]),
    "max-num-batched-tokens": st.sampled_from(["0", "1", "512", "4096", str(2**40)]),
    "watermark-frac": FLOATS,
    "n": st.sampled_from(["0", "1", "2", "4", "300"]),
    "beam-width": st.sampled_from(["0", "1", "2", "3"]),
    "eff-bw": FLOATS,
    "eff-flops": FLOATS,
    "step-overhead-s": FLOATS,
    "gpu-memory-utilization": FLOATS,
}


@pytest.fixture(autouse=True)
def one_numba_thread():
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(before)


def tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def check_one_line(status: int, err: str) -> None:
    assert status == 2, f"exit {status}: {err}"
    assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err


def check_run_dir(out: Path, config: dict) -> None:
    """The four files of a complete run, consistent with each other and with the flags given."""
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "requests.parquet", "steps.parquet", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert tuple(summary) == C.SUMMARY_KEYS
    assert summary["num_finished"] + summary["num_rejected"] == summary["num_requests"] > 0
    assert summary["num_finished"] > 0, "a run that could serve no request was not refused"
    assert summary_problem(summary) is None, summary
    stored = json.loads((out / "config.json").read_text())["config"]
    assert {k: v for k, v in stored.items() if k in config} == config


pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")  # an overflow or NaN on the way is a defect

flag_sets = st.dictionaries(st.sampled_from(sorted(FLAGS)), st.none(), max_size=5).flatmap(
    lambda keys: st.fixed_dictionaries({k: FLAGS[k] for k in keys}))


@settings(max_examples=RUN_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flags=flag_sets, existing=st.sampled_from(["none", "empty", "results"]), force=st.booleans())
def test_run_flags_give_a_complete_result_or_one_line_and_no_change(flags, existing, force):
    argv = [arg for key, value in BASE.items() for arg in ("--" + key.replace("_", "-"), str(value))]
    argv += [arg for key, value in flags.items() for arg in ("--" + key, value) if not value.startswith("-")]
    argv += [f"--{key}={value}" for key, value in flags.items() if value.startswith("-")]  # "-1" is a value
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        out = root / "out"
        if existing != "none":
            out.mkdir()
        if existing == "results":
            (out / "summary.json").write_text("an earlier run\n")
        before = tree(root)
        status, err = call(run_main, [*argv, "--out", str(out), *(["--force"] if force else [])])
        event(f"exit {status}")
        if status == 0:
            assert existing != "results" or force, "an existing result was replaced without --force"
            parsed = {f.replace("-", "_"): v for f, v in {**BASE, **flags}.items()}
            check_run_dir(out, {k: v for k, v in parsed.items() if k in ("strategy", "workload", "kv_dtype")})
            assert sorted(p.name for p in root.iterdir()) == ["out"]  # no temporary left beside it
        else:
            check_one_line(status, err)
            assert tree(root) == before and sorted(p.name for p in root.iterdir()) == sorted(
                p.name for p in [out] if existing != "none")


HOSTILE_YAML = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**64), st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.none(), st.sampled_from(["abc", "", "../x", "1e3"]), st.lists(st.integers(0, 3), max_size=2),
)
PLAUSIBLE_YAML = {  # values a sweep would use, so that accepted specs are common enough to be run
    "block_size": [1, 8, 16, 4096], "kv_slots": [600, 2048, 4096], "max_model_len": [6, 64, 512, 1024],
    "rate": [1e-3, 1, 50.0], "num_requests": [1, 5, 20], "seed": [0, 7, 2**40], "n": [1, 2], "beam_width": [1, 2],
    "watermark_frac": [0, 0.1, 0.5], "swap_gib": [0, 1.0], "strategy": registry.names(),
    "workload": ["alpaca-like", "sharegpt-like", "fixed:prompt=8,output=8", "multi-turn:turns=2"],
    "kv_dtype": ["fp32", "fp16", "bf16", "fp8"], "max_num_seqs": [1, 8, 256], "duration": [1.0, 100.0],
    "step_overhead_s": [0, 1e-3], "kernel_every": [1, 3], "preemption": ["recompute", "swap"],
}
yaml_keys = st.sampled_from([*PLAUSIBLE_YAML, "bogus_key"])


def yaml_value(key: str) -> st.SearchStrategy:
    plausible = st.sampled_from(PLAUSIBLE_YAML.get(key, [1]))
    return st.one_of(plausible, plausible, plausible, plausible, HOSTILE_YAML)  # four in five plausible


yaml_base = st.lists(yaml_keys, max_size=3, unique=True).flatmap(
    lambda keys: st.fixed_dictionaries({k: yaml_value(k) for k in keys}))
yaml_axis = yaml_keys.flatmap(lambda key: st.tuples(st.just(key), st.lists(yaml_value(key), min_size=1, max_size=2)))
yaml_names = st.one_of(st.just("fine-name_1.2"), st.just("fine-name_1.2"), st.just("fine-name_1.2"),
                       st.sampled_from(["../escape", "a/b", ".", "/tmp"]))


def sweep_yaml_values_are_refused_in_one_line_or_every_point_runs(base, axis, name):
    spec = {"name": name, "base": {**BASE, **base}, "axes": {axis[0]: axis[1]}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = root / "spec.yaml"
        path.write_text(yaml.safe_dump(spec))
        try:
            points = load_spec(path).points()
        except SpecError:
            event("refused")
            before = tree(root)
            status, err = call(sweep_main, [str(path), "--out", str(root / "out")])
            check_one_line(status, err)
            assert tree(root) == before
            return
        event(f"accepted, {len(points)} points")
        for point in points:  # accepted by validation: then every point must really run, or be refused as
            out = root / "points" / point.point_id  # unservable (that needs its workload, which validation never reads)
            try:
                run(point.config, out)
            except UnservableError:
                event("a point refused as unservable")
                assert not out.exists()
                continue
            check_run_dir(out, {"seed": point.config.seed, "strategy": point.config.strategy})



# an accepted spec runs its points (seconds each): the quick run takes a quarter of RUN_EXAMPLES, the full run
# (make test-all, CI) half
@settings(max_examples=RUN_EXAMPLES // 4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=yaml_base, axis=yaml_axis, name=yaml_names)
def test_sweep_yaml_values_are_refused_in_one_line_or_every_point_runs(base, axis, name):
    sweep_yaml_values_are_refused_in_one_line_or_every_point_runs(base, axis, name)


@pytest.mark.slow
@settings(max_examples=RUN_EXAMPLES // 4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=yaml_base, axis=yaml_axis, name=yaml_names)
def test_more_sweep_yaml_values_are_refused_in_one_line_or_every_point_runs(base, axis, name):
    sweep_yaml_values_are_refused_in_one_line_or_every_point_runs(base, axis, name)
