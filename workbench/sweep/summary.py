"""The sweep's summary table: one row per point, in expansion order, read from the points' files.

Columns: `point_id`, then the flattened run configuration (one column per `RunConfig` field), then
the run's summary metrics (`workbench.columns.SUMMARY_KEYS` and any extra keys the run reported, in
the order of its summary.json). Where a config field and a summary metric share a name
(`kv_slots`, `num_requests`) the summary keeps the name, holding the resolved value, and the
configured value moves to `config_<name>`.

The table is built only from files on disk, so it is the same whichever executor, worker count or
interruption produced the points.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.paths import open_regular
from workbench.sweep.layout import POINT_SUMMARY_FILE, SUMMARY_FILE
from workbench.sweep.spec import Point
from workbench.table_sink import write_frame


def read_point_summary(point_dir: Path) -> dict[str, Any]:
    path = point_dir / POINT_SUMMARY_FILE
    try:
        with open_regular(path) as f:  # never waits on a FIFO put in a point's place
            return json.loads(f.read())
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"{path}: cannot read the point's summary: {exc}") from None


def summary_row(point_id: str, config: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """One row of the table: the point id, the run configuration, then the run's summary metrics."""
    row: dict[str, Any] = {"point_id": point_id}
    row.update({(f"config_{k}" if k in metrics else k): v for k, v in config.items()})
    row.update(metrics)
    return row


def summary_table(points: Sequence[Point], points_dir: Path) -> pd.DataFrame:
    return pd.DataFrame([summary_row(point.point_id, point.config.to_dict(),
                                     read_point_summary(points_dir / point.point_id)) for point in points])


def write_summary(table: pd.DataFrame, out_dir: Path) -> Path:
    """Write OUT/summary.parquet atomically (temporary file + rename)."""
    path = out_dir / SUMMARY_FILE
    tmp = out_dir / f".{SUMMARY_FILE}.{os.getpid()}.tmp"
    try:
        write_frame(tmp, table)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_summary(out_dir: Path) -> pd.DataFrame:
    path = Path(out_dir) / SUMMARY_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no sweep summary; run the sweep first")
    return pd.read_parquet(path)
