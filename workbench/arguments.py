"""The Python API's own arguments (not run flags, which `config.plain_value` takes): each converted to
its plain Python type, or refused in one line naming the argument, before any work. A notebook passes
NumPy and pandas scalars (`numpy.int64(2)`) where a script passes `2`; both mean the same."""

from __future__ import annotations

import numbers
import operator
from typing import Any

import numpy as np

from workbench.errors import ConfigError, shown


def count_argument(name: str, value: Any, *, minimum: int = 1) -> int | None:
    """`value` as an int >= `minimum` (None stays None: the default); ConfigError otherwise."""
    if value is None:
        return None
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {type(value).__name__} {shown(value)}")
    number = operator.index(value)
    if number < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {number}")
    return number


def switch_argument(name: str, value: Any) -> bool:
    """`value` as a bool; ConfigError for anything but true or false (a string "no" is not false)."""
    if not isinstance(value, bool | np.bool_):
        raise ConfigError(f"{name} must be True or False, got {type(value).__name__} {shown(value)}")
    return bool(value)


def text_argument(name: str, value: Any, *, optional: bool = False) -> str | None:
    """`value` as a str (None allowed when `optional`); ConfigError otherwise."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {type(value).__name__} {shown(value)}")
    return str(value)
