"""Sweep YAML: validation errors name the file, the key path and the fix; expansion is a cross product."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.config import RunConfig
from workbench.experiments import builtin_dir, find_experiment
from workbench.figures.registry import FIGURE_NAMES
from workbench.paper.__main__ import experiment_names
from workbench.paper.row import load_values
from workbench.sweep import SpecError, config_id, load_spec, parse_spec


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    return message


def test_unknown_key_names_the_closest_valid_one(tmp_path):
    message = error_of(tmp_path, "axes:\n  blok_size: [8, 16]\n")
    assert "axes.blok_size" in message and "did you mean 'block_size'" in message


def test_unknown_key_in_base_and_zip_and_top_level(tmp_path):
    assert "base.kv_gb" in error_of(tmp_path, "base: {kv_gb: 12}\n")
    assert "did you mean 'kv_gib'" in error_of(tmp_path, "base: {kv_gb: 12}\n")
    message = error_of(tmp_path, "zip:\n  - {rate: [1, 2], sed: [0, 1]}\n")
    assert "zip[0].sed" in message and "'seed'" in message
    assert "did you mean 'axes'" in error_of(tmp_path, "axis: {rate: [1]}\n")


def test_a_key_far_from_any_lists_the_valid_ones(tmp_path):
    message = error_of(tmp_path, "base: {zzzzzz: 1}\n")
    assert "valid:" in message and "block_size" in message


def test_wrong_types(tmp_path):
    message = error_of(tmp_path, "axes:\n  block_size: [8, sixteen]\n")
    assert "axes.block_size[1]" in message and "expected int" in message and "'sixteen'" in message
    assert "expected str" in error_of(tmp_path, "base: {strategy: 3}\n")
    assert "expected int" in error_of(tmp_path, "base: {block_size: true}\n")
    assert "expected int" in error_of(tmp_path, "base: {block_size: 1.5}\n")
    assert "cannot be null" in error_of(tmp_path, "base: {strategy: null}\n")


def test_values_the_config_rejects(tmp_path):
    assert "axes.block_size[0]: block_size must be > 0" in error_of(tmp_path, "axes: {block_size: [0, 16]}\n")
    assert "axes.fit[1]" in error_of(tmp_path, "axes: {fit: [first, worst]}\n")
    assert "unknown model 'opt-14b'" in error_of(tmp_path, "base: {model: opt-14b}\n")
    assert "unknown gpu" in error_of(tmp_path, "base: {gpu: a200}\n")
    message = error_of(tmp_path, "axes: {strategy: [paged, contiguos-max]}\n")
    assert "axes.strategy[1]" in message and "did you mean 'contiguous-max'" in message
    message = error_of(tmp_path, "base: {workload: 'fixd:prompt=10'}\n")
    assert "base.workload" in message and "fixd" in message


def test_structure_errors(tmp_path):
    assert "empty list" in error_of(tmp_path, "axes: {block_size: []}\n")
    assert "expected a list" in error_of(tmp_path, "axes: {block_size: 16}\n")
    assert "expected a mapping" in error_of(tmp_path, "- 1\n- 2\n")
    assert "zip: expected a list of groups" in error_of(tmp_path, "zip: {rate: [1]}\n")
    assert "zip[0]: empty group" in error_of(tmp_path, "zip:\n  - {}\n")
    assert "not valid YAML" in error_of(tmp_path, "axes: [\n")


def test_zip_lists_of_unequal_length(tmp_path):
    message = error_of(tmp_path, "zip:\n  - {rate: [1, 2, 3], seed: [0, 1]}\n")
    assert "zip[0]" in message and "equal lengths" in message and "rate has 3" in message and "seed has 2" in message


def test_a_key_varied_twice(tmp_path):
    assert "already set in axes" in error_of(tmp_path, "axes: {rate: [1]}\nzip:\n  - {rate: [1], seed: [0]}\n")
    message = error_of(tmp_path, "zip:\n  - {rate: [1], seed: [0]}\n  - {n: [2], rate: [3]}\n")
    assert "zip[1].rate" in message and "already set in zip[0]" in message


def test_axes_override_base():
    spec = parse_spec({"base": {"rate": 2, "seed": 7}, "axes": {"rate": [1, 3]}})
    assert [(p.config.rate, p.config.seed) for p in spec.points()] == [(1.0, 7), (3.0, 7)]


def test_combinations_the_config_rejects_name_the_point(tmp_path):
    message = error_of(tmp_path, "axes: {n: [1, 2], beam_width: [1, 4]}\n")
    assert "point 3 (n=2, beam_width=4)" in message and "contradictory" in message


def test_points_resolving_to_the_same_configuration(tmp_path):
    message = error_of(tmp_path, "base: {rate: 1.0}\nzip:\n  - {seed: [0, 0], n: [1, 1]}\n")
    assert "points 0 and 1 resolve to the same configuration" in message


def test_missing_file():
    with pytest.raises(SpecError, match="cannot read"):
        load_spec("/nonexistent/exp.yaml")


def test_expansion_crosses_axes_with_zip_groups():
    spec = parse_spec({
        "base": {"model": "opt-13b", "kv_gib": 12},
        "axes": {"strategy": ["paged", "contiguous-max"], "block_size": [8, 16, 32]},
        "zip": [{"rate": [1, 2], "seed": [5, 6]}, {"n": [1, 2, 4]}],
    })
    points = spec.points()
    assert len(points) == 2 * 3 * 2 * 3
    expected = itertools.product(["paged", "contiguous-max"], [8, 16, 32], [(1.0, 5), (2.0, 6)], [1, 2, 4])
    for index, (point, (strategy, block_size, (rate, seed), n)) in enumerate(zip(points, expected, strict=True)):
        assert point.index == index
        assert point.varied == {"strategy": strategy, "block_size": block_size, "rate": rate, "seed": seed, "n": n}
        assert point.config == RunConfig(model="opt-13b", kv_gib=12.0, strategy=strategy, block_size=block_size,
                                         rate=rate, seed=seed, n=n)
        assert point.point_id == config_id(point.config)
    assert len({p.point_id for p in points}) == len(points)


def test_base_only_is_one_point():
    (point,) = parse_spec({"base": {"rate": 3}}).points()
    assert point.config == RunConfig(rate=3.0) and point.varied == {}


def test_point_id_is_the_resolved_configuration():
    # int and float spellings of a float field, and defaults given explicitly, are the same point
    a = parse_spec({"base": {"rate": 2}}).points()[0]
    b = parse_spec({"base": {"rate": 2.0, "block_size": RunConfig().block_size}}).points()[0]
    c = parse_spec({"base": {"rate": 2.5}}).points()[0]
    assert a.point_id == b.point_id != c.point_id
    assert len(a.point_id) == 12 and int(a.point_id, 16) >= 0


def test_name_defaults_to_the_file_stem(tmp_path):
    path = tmp_path / "my-study.yaml"
    path.write_text("axes: {seed: [0, 1]}\n")
    assert load_spec(path).name == "my-study"


def test_every_field_of_run_config_is_a_valid_key():
    # sweep keys are exactly the RunConfig fields, whatever fields the config gains later
    defaults = {f.name: getattr(RunConfig(), f.name) for f in dataclasses.fields(RunConfig)}
    spec = parse_spec({"base": {k: v for k, v in defaults.items() if v is not None}})
    assert spec.points()[0].config == RunConfig()


@settings(max_examples=40, deadline=None)
@given(block_sizes=st.lists(st.integers(1, 256), min_size=1, max_size=4, unique=True),
       seeds=st.lists(st.integers(0, 10**6), min_size=1, max_size=3, unique=True),
       rates=st.lists(st.floats(0.1, 100, allow_nan=False), min_size=1, max_size=3, unique=True))
def test_expansion_size_order_and_ids(block_sizes, seeds, rates):
    zip_seeds = seeds[: len(rates)]
    zip_rates = rates[: len(zip_seeds)]
    spec = parse_spec({"axes": {"block_size": block_sizes}, "zip": [{"seed": zip_seeds, "rate": zip_rates}]})
    points = spec.points()
    assert len(points) == len(block_sizes) * len(zip_seeds)
    assert [p.config.block_size for p in points] == [b for b in block_sizes for _ in zip_seeds]
    pairs = list(zip(zip_seeds, zip_rates, strict=True))
    assert [(p.config.seed, p.config.rate) for p in points] == pairs * len(block_sizes)
    assert len({p.point_id for p in points}) == len(points)
    assert spec.config_hash() == parse_spec(yaml.safe_load(yaml.safe_dump(
        {"axes": {"block_size": block_sizes}, "zip": [{"seed": zip_seeds, "rate": zip_rates}]}))).config_hash()


def test_every_shipped_experiment_is_valid():
    paths = sorted(builtin_dir().glob("*.yaml"))
    paper = [Path(name).stem for name in experiment_names(load_values())]  # python -m workbench.paper
    assert [p.stem for p in paths] == sorted(["quickstart", *(f"fig_{n}" for n in FIGURE_NAMES), *paper])
    for path in paths:
        assert load_spec(path).points()


def test_sizes_the_run_cannot_hold_fail_before_anything_runs(tmp_path):
    message = error_of(tmp_path, "base: {model: opt-13b}\naxes: {kv_slots: [4096, 1000]}\n")
    assert "point 1 (kv_slots=1000)" in message and "cannot hold a single request" in message


def test_experiments_by_path_or_by_builtin_name(tmp_path, monkeypatch):
    mine = tmp_path / "fig_sharing.yaml"
    mine.write_text("axes: {block_size: [8]}\n")
    assert find_experiment(mine) == mine  # a user's file wins over the built-in of the same name
    monkeypatch.chdir(tmp_path / "..")
    for arg in ("fig_sharing", "fig_sharing.yaml", "experiments/fig_sharing.yaml"):
        assert find_experiment(arg) == builtin_dir() / "fig_sharing.yaml"
    with pytest.raises(SpecError, match="no_such.yaml: cannot read"):
        load_spec(find_experiment("no_such.yaml"))


def test_a_pool_the_strategy_refuses_fails_before_anything_runs(tmp_path):
    # 2,048 slots of the tiny fuzz model are less than one 2 MiB page per K/V buffer
    message = error_of(tmp_path, "base: {model: 'custom:layers=2,kv_heads=2,heads=4,head_dim=8,max_model_len=512',"
                                 " kv_slots: 2048}\naxes: {strategy: [paged, virtual-contiguous]}\n")
    assert "point 1 (strategy=virtual-contiguous)" in message and "hold no whole page of 2048 KiB" in message


def test_an_option_the_strategy_does_not_take_fails_before_anything_runs(tmp_path):
    message = error_of(tmp_path, "base: {fit: best}\naxes: {strategy: [contiguous-max, paged]}\n")
    assert "point 1 (strategy=paged)" in message and "--fit best does not apply to strategy 'paged'" in message


# shapes of a spec past the point limit: axis lengths, then zip group lengths
OVERSIZED_SHAPES = [((10_001,), ()), ((), (90_000,)), ((101, 100), ()), ((300, 300), ()), ((2, 2), (2_501,)),
                    ((), (101, 100)), ((1_000, 1_000), ())]
AXIS_KEYS, ZIP_KEYS = ("seed", "block_size", "rate"), ("num_requests", "duration")


def oversized(axes: tuple[int, ...], zips: tuple[int, ...], value) -> dict:
    return {"base": {"kernel": "none"}, "axes": {AXIS_KEYS[i]: [value] * n for i, n in enumerate(axes)},
            "zip": [{ZIP_KEYS[i]: [value] * n} for i, n in enumerate(zips)]}


@pytest.mark.parametrize(("axes", "zips"), OVERSIZED_SHAPES)
def test_a_spec_past_the_point_limit_is_refused_before_any_value_is_checked(axes, zips, monkeypatch):
    from workbench.sweep import spec as spec_module

    monkeypatch.setattr(spec_module, "_checked_value", lambda *a: pytest.fail("a value was checked"))
    for value in (1, "not a number", None):  # bad values or good: the size alone refuses it
        with pytest.raises(SpecError, match=r"expands to [\d,]+ points, more than 10,000; pass --yes"):
            parse_spec(oversized(axes, zips, value))


def test_a_spec_past_the_limit_with_yes_says_so_before_it_checks_its_points(monkeypatch, capsys):
    from workbench.sweep.spec import SweepSpec

    said = []
    monkeypatch.setattr(SweepSpec, "points", lambda self: said.append(capsys.readouterr().err) or [])
    parse_spec(oversized((10_001,), (), 1), source="big.yaml", max_points=None)
    assert said == ["big.yaml: 10,001 points; checking each one before any runs\n"]
    parse_spec(oversized((10,), (), 1), max_points=None)
    assert said[1] == ""  # a small sweep starts at once, without the line
