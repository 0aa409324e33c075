"""Every rate, bandwidth, size and fraction flag has a range a real system can have, both ends, stated in its
`--help`; a value outside it is one line on stderr and exit status 2 before any work (a link of 1e-300 GB/s
would otherwise "run", its steps too short to move a float64 clock)."""

from __future__ import annotations

import dataclasses

import pytest

from workbench.config import MAX_INT, RunConfig, describe_bounds
from workbench.run import build_parser
from workbench.run import main as run_main

# integer flags that count things rather than measure them: bounded only by int64 (and the checks that use them)
COUNTS = {"seed", "kernel_every", "verify_every", "kernel_heads"}


def numeric_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(RunConfig) if str(f.type).replace(" | None", "") in ("int", "float")]


def outside(f: dataclasses.Field) -> list[float]:
    """Values just past each end of the field's range, and far past it."""
    meta, kind = f.metadata, str(f.type).replace(" | None", "")
    low = meta.get("ge", meta.get("gt"))
    high = meta.get("le", meta.get("lt"))
    values = []
    if kind == "float":
        values += [low / 10 if low > 0 else -1e-300, -1e300, 1e-300 if low > 0 else -1.0] if "ge" in meta else [low]
        values += [high * 10, 1e300] if "le" in meta else [high]
    else:
        values += [low - 1] if "ge" in meta else [low]
        values += [high + 1] if "le" in meta else [high]
    return values


@pytest.mark.parametrize("field", [f for f in numeric_fields() if f.name not in COUNTS], ids=lambda f: f.name)
def test_every_measuring_flag_has_a_range_with_both_ends_in_its_help(field):
    assert any(k in field.metadata for k in ("ge", "gt")) and any(k in field.metadata for k in ("le", "lt")), field.name
    flag = "--" + field.name.replace("_", "-")
    action = next(a for a in build_parser()._actions if flag in a.option_strings)
    assert f"[{describe_bounds(field)}]" in action.help % {"default": action.default}


@pytest.mark.parametrize("field", [f for f in numeric_fields() if f.name not in COUNTS], ids=lambda f: f.name)
def test_a_value_outside_the_range_is_one_line_and_exit_2(field, capsys, tmp_path):
    for value in outside(field):
        argv = ["--" + field.name.replace("_", "-") + "=" + repr(value), "--out", str(tmp_path / "out")]
        assert run_main(argv) == 2, (field.name, value)
        err = capsys.readouterr().err
        assert err.startswith(f"error: {field.name} must be ") and err.count("\n") == 1, err
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("field", sorted(COUNTS))
def test_a_count_stays_within_int64(field, capsys):
    assert run_main([f"--{field.replace('_', '-')}", str(MAX_INT + 1)]) == 2
    assert f"{field} must be <= {MAX_INT}" in capsys.readouterr().err
