"""Per-step and per-request tables, the run-level summary (docs/memory.md, docs/outputs.md), and atomic writing.

Step rows go into preallocated NumPy columns (one row per engine step, ~100k+ per trace replay),
so recording a step is two row assignments, not a dict per step.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench import columns as C
from workbench.outdir import OutputExistsError, install, staging_dir

# Storage order of a step row: the float columns, then the integer columns.
FLOAT_STEP_COLUMNS = ("t_s", "dt_s", "kernel_time_s")
INT_STEP_COLUMNS = tuple(c for c in C.STEP_COLUMNS if c not in FLOAT_STEP_COLUMNS)


class StepLog:
    """Growable columnar storage of step rows. `record` mutates."""

    def __init__(self, initial_rows: int = 4096) -> None:
        self.num_rows = 0
        self.floats = np.zeros((initial_rows, len(FLOAT_STEP_COLUMNS)), dtype=np.float64)
        self.ints = np.zeros((initial_rows, len(INT_STEP_COLUMNS)), dtype=np.int64)
        # a hybrid pool's per-group columns (name -> one value per row), recorded beside every row
        self.group_columns: dict[str, list[int]] = {}

    def record_groups(self, values: dict[str, int]) -> None:
        """Per-group values of the row just recorded (`group<i>_<part>` columns). Mutates."""
        for name, value in values.items():
            self.group_columns.setdefault(name, []).append(value)

    def record(self, floats: tuple[float, ...], ints: tuple[int, ...]) -> None:
        """Append one row; `floats` in FLOAT_STEP_COLUMNS order, `ints` in INT_STEP_COLUMNS order."""
        i = self.num_rows
        if i == self.floats.shape[0]:
            self.floats = np.concatenate([self.floats, np.zeros_like(self.floats)])
            self.ints = np.concatenate([self.ints, np.zeros_like(self.ints)])
        self.floats[i] = floats
        self.ints[i] = ints
        self.num_rows = i + 1

    def to_frame(self) -> pd.DataFrame:
        n = self.num_rows
        data: dict[str, np.ndarray] = {}
        for j, name in enumerate(FLOAT_STEP_COLUMNS):
            data[name] = self.floats[:n, j].copy()
        for j, name in enumerate(INT_STEP_COLUMNS):
            data[name] = self.ints[:n, j].copy()
        for name, values in self.group_columns.items():
            data[name] = np.asarray(values, dtype=np.int64)
        return pd.DataFrame({name: data[name] for name in (*C.STEP_COLUMNS, *self.group_columns)})


def _dot(values: np.ndarray, weights: np.ndarray) -> float:
    """Σ values·weights in float64 by NumPy's pairwise sum, never BLAS: a BLAS dot splits the sum
    across its threads, so its last bit would depend on the thread count of the machine."""
    return float(np.sum(values.astype(np.float64) * weights))


def _weighted_frac(values: np.ndarray, weights: np.ndarray, capacity_slots: int) -> float:
    total = float(weights.sum())
    if total <= 0:
        return math.nan
    return _dot(values, weights) / total / capacity_slots


def _percentile(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else math.nan


def summarize(steps: pd.DataFrame, requests: pd.DataFrame, *, capacity_slots: int,
              generated_tokens: int, extra: dict[str, Any]) -> dict[str, Any]:
    """The run-level figures of docs/outputs.md from the two tables.

    `generated_tokens` counts every sample's tokens of the finished requests; `extra` supplies the
    keys the tables cannot give (prefix counters, kernel figures, wall time)."""
    dt = steps["dt_s"].to_numpy()  # [num_steps]
    saturated = steps["num_waiting"].to_numpy() > 0
    out: dict[str, Any] = {"kv_slots": int(capacity_slots), "num_requests": int(len(requests)),
                           "sim_time_s": float(steps["t_s"].iloc[-1]) if len(steps) else 0.0}
    for col, key in zip(C.SLOT_COLUMNS, C.MEM_FRAC_KEYS, strict=True):
        out[key] = _weighted_frac(steps[col].to_numpy(), dt, capacity_slots)
    for col, key in zip(C.SLOT_COLUMNS, C.MEM_FRAC_SAT_KEYS, strict=True):
        out[key] = _weighted_frac(steps[col].to_numpy()[saturated], dt[saturated], capacity_slots)

    # free memory in any extent: what a contiguous request could have used if it were one piece
    unallocated = (steps["free_slots"] + steps["external_frag_slots"]).to_numpy().astype(np.float64)
    largest = steps["largest_free_extent_slots"].to_numpy().astype(np.float64)
    frag = np.where(unallocated > 0, 1.0 - largest / np.maximum(unallocated, 1.0), 0.0)
    out["ext_frag_index"] = float(frag.mean()) if frag.size else 0.0

    logical = _dot(steps["logical_token_slots"].to_numpy(), dt)
    token = _dot(steps["token_slots"].to_numpy(), dt)
    out["sharing_saving_frac"] = 1.0 - token / logical if logical > 0 else 0.0
    allocated = (steps["token_slots"] + steps["reserved_slots"] + steps["internal_frag_slots"]).to_numpy()
    unshared = _dot(steps["unshared_block_slots"].to_numpy(), dt)
    out["block_sharing_saving_frac"] = 1.0 - _dot(allocated, dt) / unshared if unshared > 0 else 0.0

    query, hit = int(extra["prefix_query_tokens"]), int(extra["prefix_hit_tokens"])
    out["prefix_query_tokens"], out["prefix_hit_tokens"] = query, hit
    out["prefix_hit_rate"] = hit / query if query else 0.0
    out["prefix_evicted_blocks"] = int(extra["prefix_evicted_blocks"])
    # a prefix cache's host tier (workbench.engine.summary_counters); absent from `extra` without one
    out["prefix_hit_rate_host"] = int(extra.get("prefix_hit_tokens_host", 0)) / query if query else 0.0
    out["host_bytes_loaded"] = int(extra.get("host_bytes_loaded", 0))
    out["host_bytes_demoted"] = int(extra.get("host_bytes_demoted", 0))
    # a fleet's shared tier, the same way; absent from `extra` without one
    out["prefix_hit_rate_shared"] = int(extra.get("prefix_hit_tokens_shared", 0)) / query if query else 0.0
    out["shared_bytes_loaded"] = int(extra.get("shared_bytes_loaded", 0))
    out["shared_bytes_demoted"] = int(extra.get("shared_bytes_demoted", 0))
    out["block_table_bytes_mean"] = (_dot(steps["block_table_bytes"].to_numpy(), dt) / float(dt.sum())
                                     if dt.sum() > 0 else 0.0)
    running = steps["num_running"].to_numpy()
    out["mean_batch_size"] = float(running.mean()) if running.size else 0.0
    out["max_batch_size"] = int(running.max()) if running.size else 0
    out["saturated_step_frac"] = float(saturated.mean()) if saturated.size else 0.0
    out["mean_batch_size_sat"] = float(running[saturated].mean()) if saturated.any() else math.nan
    # every running sequence samples one token per step (a prefill its first, a recompute its next)
    sat_s = float(dt[saturated].sum())
    out["throughput_tok_s_sat"] = float(running[saturated].sum()) / sat_s if sat_s > 0 else math.nan

    finished = requests[requests["status"] == "finished"]
    sim_time = out["sim_time_s"]
    out["throughput_req_s"] = len(finished) / sim_time if sim_time > 0 else 0.0
    out["throughput_tok_s"] = generated_tokens / sim_time if sim_time > 0 else 0.0
    arrival = finished["arrival_s"].to_numpy()
    first = finished["first_token_s"].to_numpy()
    finish = finished["finish_s"].to_numpy()
    output = finished["output_tokens"].to_numpy()
    out["normalized_latency_s_per_tok"] = float(((finish - arrival) / output).mean()) if len(finished) else math.nan
    ttft = first - arrival
    multi = output > 1
    tpot = (finish[multi] - first[multi]) / (output[multi] - 1)
    out["ttft_p50_s"], out["ttft_p99_s"] = _percentile(ttft, 50), _percentile(ttft, 99)
    out["tpot_p50_s"], out["tpot_p99_s"] = _percentile(tpot, 50), _percentile(tpot, 99)
    out["num_finished"] = int(len(finished))
    out["num_rejected"] = int(len(requests) - len(finished))
    out["num_preemptions"] = int(steps["preemptions"].sum())
    out["cow_copies"] = int(steps["cow_copies"].sum())
    for key in ("kernel_backend", "kernel_time_s", "kernel_gbps", "verify_max_rel_err", "sim_wall_s"):
        out[key] = extra[key]
    return {key: out[key] for key in C.SUMMARY_KEYS}


def summary_problem(summary: Any) -> str | None:
    """Why `summary` (a summary.json read back) is not what `summarize` writes, None when it is: every key
    of columns.SUMMARY_KEYS, text where text belongs, and elsewhere a number, finite unless the key may
    be NaN. A kept sweep point is trusted only when this is None."""
    if not isinstance(summary, dict):
        return f"is a {type(summary).__name__}, not a JSON object"
    for key in C.SUMMARY_KEYS:
        if key not in summary:
            return f"lacks {key}"
        value = summary[key]
        if key in C.SUMMARY_TEXT_KEYS:
            if not isinstance(value, str):
                return f"{key} is {type(value).__name__}, not text"
        elif isinstance(value, bool) or not isinstance(value, int | float):
            return f"{key} is {type(value).__name__}, not a number"
        elif not math.isfinite(value) and not (key in C.SUMMARY_NAN_KEYS and math.isnan(value)):
            return f"{key} is {value}, not a finite number"
    return None


def write_outputs(out_dir: Path, config: dict[str, Any], steps: pd.DataFrame, requests: pd.DataFrame,
                  summary: dict[str, Any], *, replace: bool = False) -> None:
    """Write the four run files (docs/outputs.md) into a temporary sibling of `out_dir` and rename it to
    `out_dir`, so the directory appears only when complete. An `out_dir` holding results is overwritten only
    with `replace` (`outdir.install`: the old one is removed once the new one is in place); otherwise it
    raises OutputExistsError and the new files stay in the temporary directory it names."""
    staged = staging_dir(out_dir)
    staged.mkdir(parents=True)
    try:
        (staged / "config.json").write_text(json.dumps(config, indent=2, sort_keys=False) + "\n")
        steps.to_parquet(staged / "steps.parquet", index=False)
        requests.to_parquet(staged / "requests.parquet", index=False)
        (staged / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
        install(staged, out_dir, replace=replace)
    except OutputExistsError:  # the message names `staged`, where the new result is kept
        raise
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
