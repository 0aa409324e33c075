"""Every argument of the Python API is converted to its plain Python type at the boundary, or refused in one
line before any work: NumPy and pandas scalars, fractions and decimals are numbers a notebook passes."""

from __future__ import annotations

import dataclasses
import decimal
import fractions
import json

import numpy as np
import pytest

import workbench as wb
from workbench.config import RunConfig
from workbench.errors import ConfigError

# how a notebook spells a number: each wrapper applied to a valid plain value of the field's kind
INT_WRAPPERS = (np.int64, np.int32, np.uint16, int)
FLOAT_WRAPPERS = (np.float64, np.float32, fractions.Fraction, decimal.Decimal, np.int64, int)


def numeric_fields() -> list[tuple[dataclasses.Field, object]]:
    """(field, a valid plain value) for every int and float field of RunConfig."""
    out = []
    for f in dataclasses.fields(RunConfig):
        kind = str(f.type).replace(" | None", "")
        if kind not in ("int", "float"):
            continue
        value = f.default if f.default is not None else f.metadata.get("ge", f.metadata.get("gt", 0) + 1)
        out.append((f, int(value) if kind == "int" else float(value)))
    return out


@pytest.mark.parametrize(("field", "plain"), numeric_fields(), ids=lambda x: getattr(x, "name", ""))
def test_a_numeric_flag_of_any_scalar_type_becomes_its_plain_value(field, plain):
    kind = str(field.type).replace(" | None", "")
    wrappers = INT_WRAPPERS if kind == "int" else FLOAT_WRAPPERS
    reference = RunConfig(**{field.name: plain})
    for wrap in wrappers:
        if kind == "float" and wrap in (np.int64, int) and plain != int(plain):
            continue
        try:
            wrapped = wrap(plain if kind == "int" or wrap is not decimal.Decimal else repr(plain))
        except OverflowError:  # np.uint16 of a large default
            continue
        if wrap is np.float32 and float(wrapped) != plain:  # not exactly representable: another value
            continue
        cfg = RunConfig(**{field.name: wrapped})
        value = getattr(cfg, field.name)
        assert type(value) is (int if kind == "int" else float), (field.name, wrap)
        assert cfg == reference and json.dumps(cfg.to_dict()) == json.dumps(reference.to_dict())


@pytest.mark.parametrize("bad", ["2", b"2", True, np.bool_(True), [2], 2.5, np.float64(2.0), fractions.Fraction(5, 2),
                                 None, complex(2)])
def test_an_integer_flag_refuses_what_is_not_an_integer(bad):
    with pytest.raises(ValueError, match="^replicas "):
        RunConfig(replicas=bad)


@pytest.mark.parametrize("bad", ["0.5", True, np.bool_(False), [1.0], complex(1), decimal.Decimal("NaN"),
                                 fractions.Fraction(10**400, 3)])
def test_a_float_flag_refuses_what_is_not_a_finite_number(bad):
    with pytest.raises(ValueError, match="^rate "):
        RunConfig(rate=bad)


def test_switches_and_names_take_numpy_scalars():
    cfg = RunConfig(chunked_prefill=np.bool_(True), strategy=np.str_("paged"), max_num_batched_tokens=4096)
    assert cfg.chunked_prefill is True and type(cfg.strategy) is str
    with pytest.raises(ValueError, match="chunked_prefill must be true or false"):
        RunConfig(chunked_prefill=1)


SWEEP_ARGUMENTS = [("jobs", "2"), ("jobs", 0), ("jobs", 2.0), ("jobs", True), ("workers", "1"), ("resume", "yes"),
                   ("force", 1), ("progress", None), ("executor", 3), ("scheduler", 5), ("max_points", -1),
                   ("out", 7)]


@pytest.mark.parametrize(("name", "value"), SWEEP_ARGUMENTS)
def test_a_bad_sweep_argument_is_one_error_before_any_work(name, value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=f"^{name} must be"):
        wb.sweep({"base": {"kernel": "none"}, "axes": {"seed": [1]}}, **{"out": tmp_path / "out", name: value})
    assert not (tmp_path / "out").exists()


def test_sweep_counts_of_numpy_type_are_taken(tmp_path):
    (tmp_path / "summary.parquet").write_bytes(b"")
    with pytest.raises(ConfigError, match="--out .* already holds a sweep"):  # past every argument check
        wb.sweep({"base": {"kernel": "none"}, "axes": {"seed": [1]}}, tmp_path, jobs=np.int64(2),
                 resume=np.bool_(False))


def test_run_checks_its_own_arguments():
    with pytest.raises(ConfigError, match="^progress must be True or False"):
        wb.run(progress="no", kernel="none")


@pytest.mark.parametrize("axis", [[np.int64(8), np.int32(16)], np.array([8, 16]), (8, np.uint8(16))])
def test_a_sweep_spec_built_in_python_takes_numpy_values(axis):
    from workbench.sweep import parse_spec

    points = parse_spec({"base": {"kernel": "none", "rate": np.float32(2.0), "chunked_prefill": np.bool_(False)},
                         "axes": {"block_size": axis}}).points()
    assert [p.config.block_size for p in points] == [8, 16]
    assert all(type(p.config.block_size) is int and type(p.config.rate) is float for p in points)
    assert points[0].point_id == parse_spec({"base": {"kernel": "none", "rate": 2.0},
                                             "axes": {"block_size": [8, 16]}}).points()[0].point_id
