"""Sweep specification: a YAML file of `base` + `axes` + optional `zip` groups, validated and expanded.

```yaml
name: block-size            # optional; default: the file's stem
figure: memory_waste        # optional; the figure the sweep CLI draws from the summary
base: {model: opt-13b, kv_gib: 12}
axes:                       # cross product, the first axis varies slowest
  strategy: [paged, paged-prefix]
  block_size: [8, 16, 32]
zip:                        # each group's lists are zipped, then crossed with the axes
  - {workload: [sharegpt-like, alpaca-like], rate: [2.0, 20.0]}
```

Every key under `base`, `axes` and `zip` is a `RunConfig` field name (the run flags in snake_case).
An axis or zip key overrides the same key of `base`; a key may be varied in one place only.
Errors name the file and the key path (`axes.block_size[2]`) and show a value at most
`errors.SHOWN_CHARS` long. The YAML is read by `workbench.user_yaml`: plain data, no key twice in a
mapping, anchors and aliases expanding to at most 100,000 values nested at most 32 deep. A point's id
is a short hash of the canonical JSON of the configuration fields that differ from their defaults, so it
is stable across runs, executors, machines and the addition of new fields.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import itertools
import json
import math
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from workbench import presets, user_yaml
from workbench.allocators.registry import check_strategy
from workbench.allocators.registry import names as strategy_names
from workbench.config import RunConfig, plain_value
from workbench.errors import shown
from workbench.workload.build import check_workload
from workbench.workload.spec import parse_spec as parse_workload

TOP_LEVEL_KEYS = ("name", "description", "figure", "base", "axes", "zip")
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
MAX_POINTS = 10_000  # a larger sweep is refused unless asked for (`--yes`): it is likely a typo in an axis
POINT_ID_HEX = 12


class SpecError(ValueError):
    """An invalid sweep specification; the message names the file and the key path."""


@dataclass(frozen=True)
class Point:
    index: int  # position in the expansion order
    point_id: str
    config: RunConfig
    varied: dict[str, Any]  # the axis and zip values of this point, in spec order


@dataclass(frozen=True)
class SweepSpec:
    name: str
    source: str  # the YAML path, or a label for specs built in code
    base: dict[str, Any]
    axes: dict[str, list[Any]]
    zips: list[dict[str, list[Any]]]
    figure: str | None = None
    description: str = ""

    def num_points(self) -> int:
        """The number of points, without expanding them."""
        count = math.prod(len(values) for values in self.axes.values())
        return count * math.prod(len(next(iter(group.values()))) for group in self.zips)

    def points(self) -> list[Point]:
        """The expansion: axes crossed (first slowest) with zip groups; raises SpecError on a bad or repeated point."""
        dims: list[list[dict[str, Any]]] = [[{key: v} for v in values] for key, values in self.axes.items()]
        for group in self.zips:
            length = len(next(iter(group.values())))
            dims.append([{key: values[i] for key, values in group.items()} for i in range(length)])
        points: list[Point] = []
        seen: dict[str, int] = {}
        workloads_checked: set[tuple[Any, ...]] = set()
        strategies_checked: set[str] = set()
        count = self.num_points()
        # a sweep past MAX_POINTS (--yes) takes a while to check: a bar on stderr shows that it is at work
        with tqdm(total=count, desc="checking points", unit="point", file=sys.stderr, disable=count <= MAX_POINTS,
                  mininterval=1.0, leave=False, dynamic_ncols=True) as bar:
            for index, combo in enumerate(itertools.product(*dims)):
                points.append(self._point(index, combo, seen, workloads_checked, strategies_checked))
                bar.update(1)
        return points

    def _point(self, index: int, combo: tuple[dict[str, Any], ...], seen: dict[str, int],
               workloads_checked: set[tuple[Any, ...]], strategies_checked: set[str]) -> Point:
        """Point `index` of the expansion, checked; `seen` (point ids) and the two sets (what earlier points
        checked) are mutated."""
        varied = {k: v for part in combo for k, v in part.items()}
        try:
            config = RunConfig(**{**self.base, **varied})
            resolved = config.resolve()  # impossible size combinations fail here, not in a worker mid-sweep
            workload_key = (config.workload, config.model, config.max_model_len, config.rate)
            if workload_key not in workloads_checked:  # what check_workload reads; the seed is irrelevant
                check_workload(config)
                workloads_checked.add(workload_key)
            strategy_key = _strategy_key(config)
            if strategy_key not in strategies_checked:  # options and pool the strategy refuses
                check_strategy(config, resolved)
                strategies_checked.add(strategy_key)
        except ValueError as exc:
            raise SpecError(f"{self.source}: point {index} ({describe(varied)}): {exc}") from None
        point_id = config_id(config)
        if point_id in seen:
            raise SpecError(f"{self.source}: points {seen[point_id]} and {index} resolve to the same "
                            f"configuration ({describe(varied)})")
        seen[point_id] = index
        return Point(index, point_id, config, varied)

    def config_hash(self) -> str:
        """A hash of every point's resolved configuration, in expansion order (figure provenance)."""
        return _short_hash(json.dumps([p.point_id for p in self.points()]))


_NOT_READ_BY_STRATEGIES = ("seed", "workload", "rate", "num_requests", "duration")


def _strategy_key(config: RunConfig) -> str:
    """The configuration without the fields a strategy's construction never reads, so that points
    differing only in those are checked once."""
    fields = {k: v for k, v in config.to_dict().items() if k not in _NOT_READ_BY_STRATEGIES}
    return json.dumps(fields, sort_keys=True, separators=(",", ":"))


def config_id(config: RunConfig) -> str:
    """Short hex id of a configuration: a hash of the canonical JSON (sorted keys, no spaces) of the fields
    whose value differs from the field's default. A field added with a default that keeps the old behaviour
    leaves every id as it was; whether the code that made a point still stands is for `--resume` to judge
    from the version and commit the point records (workbench.sweep.runner), not for its id."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    changed = {name: value for name, value in config.to_dict().items() if value != defaults[name]}
    return _short_hash(json.dumps(changed, sort_keys=True, separators=(",", ":")))


def load_spec(path: str | Path, *, max_points: int | None = MAX_POINTS) -> SweepSpec:
    """Read and validate a sweep YAML file; raises SpecError naming the file on any problem."""
    path = Path(path)
    try:
        data = user_yaml.load_file(path)
    except user_yaml.UserYamlError as exc:
        raise SpecError(str(exc)) from None
    return parse_spec(data, source=str(path), default_name=path.stem, max_points=max_points)


def parse_spec(data: Any, *, source: str = "<spec>", default_name: str = "sweep",
               max_points: int | None = MAX_POINTS) -> SweepSpec:
    """Validate a spec already loaded as plain data (the YAML document). A spec of more than
    `max_points` points (None: no limit) is refused before it is expanded."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping with keys {', '.join(TOP_LEVEL_KEYS)}, "
                        f"got {type(data).__name__}")
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            raise SpecError(f"{source}: {_unknown(key, TOP_LEVEL_KEYS)}")
    name = data.get("name", default_name)
    for key in ("name", "description", "figure"):
        if key in data and not isinstance(data[key], str):
            raise SpecError(f"{source}: {key}: expected a string, got {shown(data[key])}")
    if not NAME_PATTERN.fullmatch(name):  # the name becomes a directory: runs/<name>
        where = "name" if "name" in data else f"name (the file's stem, {shown(name)})"
        raise SpecError(f"{source}: {where}: expected an identifier of letters, digits, '_', '-', '.' "
                        f"('-' and '.' not first), at most 100 characters, got {shown(name)}")

    # the shape first (mappings of lists, zip groups of equal lengths), then the size, then each value: a spec of
    # too many points is refused before its values are checked one by one
    base = _mapping(data.get("base", {}), "base", source)
    sections: list[tuple[str, dict[str, Any]]] = []  # the varied keys; each in one place (base may be overridden)

    axes = _mapping(data.get("axes", {}), "axes", source)
    for key, values in axes.items():
        axes[key] = _as_list(values, f"axes.{key}", source)
    sections.append(("axes", axes))

    raw_zips = data.get("zip", [])
    if not isinstance(raw_zips, list):
        raise SpecError(f"{source}: zip: expected a list of groups (mappings of key: list), got {shown(raw_zips)}")
    zips: list[dict[str, list[Any]]] = []
    for i, raw_group in enumerate(raw_zips):
        group = _mapping(raw_group, f"zip[{i}]", source)
        if not group:
            raise SpecError(f"{source}: zip[{i}]: empty group; give at least one key: list")
        for key, values in group.items():
            group[key] = _as_list(values, f"zip[{i}].{key}", source)
        lengths = {key: len(values) for key, values in group.items()}
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{k} has {n}" for k, n in lengths.items())
            raise SpecError(f"{source}: zip[{i}]: lists must have equal lengths ({detail})")
        zips.append(group)
        sections.append((f"zip[{i}]", group))

    owner: dict[str, str] = {}
    for section, keys in sections:
        for key in keys:
            if key in owner:
                raise SpecError(f"{source}: {section}.{key}: '{key}' is already set in {owner[key]}; "
                                "give each key in one place only")
            owner[key] = section
    spec = SweepSpec(name=name, source=source, base=base, axes=axes, zips=zips,
                     figure=data.get("figure"), description=data.get("description", ""))
    num_points = spec.num_points()
    if max_points is not None and num_points > max_points:
        raise SpecError(f"{source}: expands to {num_points:,} points, more than {max_points:,}; "
                        f"pass --yes to run it anyway")
    checked: dict[tuple[str, type, Any], Any] = {}  # a value repeated in many places is checked once
    for key, value in base.items():
        base[key] = _check_value(value, key, f"base.{key}", source, checked)
    for section, lists in sections:
        for key, values in lists.items():
            lists[key] = [_check_value(v, key, f"{section}.{key}[{i}]", source, checked)
                          for i, v in enumerate(values)]
    if num_points > MAX_POINTS:  # a large sweep (--yes) says what it is doing before it goes quiet checking
        print(f"{source}: {num_points:,} points; checking each one before any runs", file=sys.stderr, flush=True)
    spec.points()  # validates every combination (cross-field rules, duplicates) before anything runs
    return spec


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:POINT_ID_HEX]


def describe(varied: dict[str, Any]) -> str:
    """`strategy=paged, block_size=16`: the varied values of a point, for messages and labels."""
    return ", ".join(f"{k}={v}" for k, v in varied.items()) or "base only"


def _key_text(key: Any) -> str:
    """A key as it appears in a key path: as written when it is a short string, else shortened."""
    return key if isinstance(key, str) and len(key) <= 40 else shown(key)


def _unknown(key: Any, valid: typing.Sequence[str]) -> str:
    return f"unknown key {shown(key)}; {_hint(key, valid)}"


def _hint(name: Any, valid: typing.Sequence[str]) -> str:
    close = difflib.get_close_matches(str(name)[:100], valid, n=1) if isinstance(name, str) else []
    return f"did you mean '{close[0]}'?" if close else f"valid: {', '.join(valid)}"


def _mapping(value: Any, path: str, source: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"{source}: {path}: expected a mapping of run flags, got {shown(value)}")
    fields = RunConfig.field_names()
    for key in value:
        if key not in fields:
            raise SpecError(f"{source}: {path}.{_key_text(key)}: {_unknown(key, fields)}")
    return dict(value)


def _as_list(values: Any, path: str, source: str) -> list[Any]:
    if isinstance(values, tuple | np.ndarray) and np.ndim(values) == 1:  # a spec built in Python
        values = list(values)
    if not isinstance(values, list):
        raise SpecError(f"{source}: {path}: expected a list of values, got {shown(values)}")
    if not values:
        raise SpecError(f"{source}: {path}: empty list; an axis needs at least one value")
    return list(values)


def _check_value(value: Any, key: str, path: str, source: str,
                 checked: dict[tuple[str, type, Any], Any] | None = None) -> Any:
    """The value converted to the field's type (int → float for float fields, so ids are canonical). `checked`
    remembers the values of plain types already checked for a key (keyed by type too: 1, 1.0 and True are equal
    in Python, not in a spec)."""
    memo = (key, type(value), value) if isinstance(value, str | int | float | bool | None) else None
    if checked is not None and memo is not None and memo in checked:
        return checked[memo]
    checked_value = _checked_value(value, key, path, source)
    if checked is not None and memo is not None:
        checked[memo] = checked_value
    return checked_value


def _checked_value(value: Any, key: str, path: str, source: str) -> Any:
    allowed = _field_types()[key]
    if value is not None and type(value) not in (str, int, float, bool):  # numpy.int64(2) from a notebook's spec
        try:
            value = plain_value(_fields()[key], value)
        except ValueError as exc:
            raise SpecError(f"{source}: {path}: {exc}") from None
    if value is None:
        if type(None) not in allowed:
            raise SpecError(f"{source}: {path}: {key} cannot be null")
        return None
    if not any(_is_instance(value, t) for t in allowed):
        if float in allowed and _is_instance(value, int):
            value = float(value)
        else:
            names = " or ".join(t.__name__ for t in allowed if t is not type(None))
            raise SpecError(f"{source}: {path}: expected {names}, got {type(value).__name__} {shown(value)}")
    try:
        RunConfig(**{key: value})
        if key == "model":
            presets.model_from_name(value)
        elif key == "gpu":
            presets.gpu_from_name(value)
        elif key == "workload":
            parse_workload(value)
        elif key == "strategy" and value not in strategy_names():
            raise ValueError(f"unknown strategy {shown(value)}; {_hint(value, strategy_names())}")
    except ValueError as exc:
        raise SpecError(f"{source}: {path}: {exc}") from None
    return value


def _is_instance(value: Any, t: type) -> bool:
    if isinstance(value, bool):  # YAML true/false is a bool, never a number
        return t is bool
    return isinstance(value, t)


@functools.cache
def _fields() -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(RunConfig)}


@functools.cache
def _field_types() -> dict[str, tuple[type, ...]]:
    hints = typing.get_type_hints(RunConfig)
    out: dict[str, tuple[type, ...]] = {}
    for f in dataclasses.fields(RunConfig):
        hint = hints[f.name]
        members = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        out[f.name] = tuple(typing.get_origin(t) or t for t in members)
    return out
