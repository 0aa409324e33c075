"""Reading a result directory back (`workbench.load`, a sweep's `--resume`): the four files of a run
(docs/outputs.md), each checked for what it must hold. Every problem is one ResultError naming the file
and what was expected, so a damaged directory is reported, never half loaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from workbench import columns as C
from workbench.config import RunConfig
from workbench.errors import ResultError, shown
from workbench.paths import open_regular
from workbench.results import summary_problem

CONFIG_FILE, SUMMARY_FILE = "config.json", "summary.json"
TABLE_COLUMNS = {"steps.parquet": C.STEP_COLUMNS, "requests.parquet": C.REQUEST_COLUMNS}
RUN_FILES = (CONFIG_FILE, *TABLE_COLUMNS, SUMMARY_FILE)
# a fleet of 1024 replicas writes ~4 MB of summary.json (per_replica); more than this is not a run's file
MAX_JSON_BYTES = 64 << 20


def read_json_object(folder: Path, name: str) -> dict[str, Any]:
    """The JSON object in `folder/name`."""
    try:
        with open_regular(folder / name) as f:
            data = f.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise ResultError(folder, name, "is missing") from None
    except OSError as exc:
        raise ResultError(folder, name, f"is unreadable: {exc.strerror or exc}; expected a regular file") from None
    if len(data) > MAX_JSON_BYTES:
        raise ResultError(folder, name, f"is more than {MAX_JSON_BYTES:,} bytes; expected a run's {name}")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, nested too deep
        raise ResultError(folder, name, f"is unreadable: {type(exc).__name__}: {shown(str(exc))}; expected "
                                        f"a JSON object") from None
    if not isinstance(value, dict):
        raise ResultError(folder, name, f"is a {type(value).__name__}, not a JSON object")
    return value


def read_config(folder: Path) -> tuple[dict[str, Any], RunConfig]:
    """config.json's contents and the run configuration under its `config` key."""
    description = read_json_object(folder, CONFIG_FILE)
    values = description.get("config")
    if not isinstance(values, dict):
        raise ResultError(folder, CONFIG_FILE, f"holds no run configuration: expected a key 'config' holding "
                                               f"the run's flags, got {shown(values)}")
    try:
        return description, RunConfig.from_dict(values)
    except (ValueError, TypeError) as exc:
        raise ResultError(folder, CONFIG_FILE, f"holds a configuration that is not valid: {exc}") from None


def read_summary(folder: Path) -> dict[str, Any]:
    """summary.json, holding every summary figure of a run."""
    summary = read_json_object(folder, SUMMARY_FILE)
    problem = summary_problem(summary)
    if problem is not None:
        raise ResultError(folder, SUMMARY_FILE, f"{problem}; expected every figure of a run's summary "
                                                f"(docs/outputs.md)")
    return summary


def check_table(folder: Path, name: str) -> None:
    """The table's Parquet footer reads and names every column the run writes (its rows are not read)."""
    _table(folder, name, lambda f: pq.read_schema(f).names)


def read_table(folder: Path, name: str) -> pd.DataFrame:
    return _table(folder, name, pd.read_parquet)


def _table(folder: Path, name: str, read):
    try:
        with open_regular(folder / name) as f:
            found = read(f)
    except FileNotFoundError:
        raise ResultError(folder, name, "is missing") from None
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise ResultError(folder, name, f"is unreadable: {type(exc).__name__}: {shown(str(exc))}; expected "
                                        f"a Parquet table") from None
    names = found.columns if isinstance(found, pd.DataFrame) else found
    missing = [c for c in TABLE_COLUMNS[name] if c not in names]
    if missing:
        raise ResultError(folder, name, f"lacks the column {missing[0]}; expected every column of "
                                        f"{name} (docs/outputs.md)")
    return found


def read_result(folder: Path) -> tuple[dict[str, Any], RunConfig, pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """(config.json's contents, the configuration, steps, requests, summary) of the run in `folder`."""
    if not folder.is_dir():
        raise ResultError(folder.parent, folder.name, f"is not a directory; expected a run's directory holding "
                                                      f"{', '.join(RUN_FILES)}")
    description, config = read_config(folder)
    summary = read_summary(folder)
    return description, config, read_table(folder, "steps.parquet"), read_table(folder, "requests.parquet"), summary
