"""Per-step and per-request tables, the run-level summary (docs/memory.md, docs/outputs.md), and atomic writing.

Step rows are kept in two flat machine arrays (`array.array`, the float and the integer columns row after
row) until `ROWS_PER_CHUNK` of them have come, then handed to the run's table sink as one chunk
(workbench.table_sink): recording a step is two C-level extends, and a run of millions of steps holds one
chunk of rows. The summary is computed from the tables read back chunk by chunk,
with NumPy's own summation order (workbench.exact_sums), so it is the same, bit for bit, as over the
whole columns at once, whichever sink held them.
"""

from __future__ import annotations

import json
import math
import shutil
from array import array
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench import columns as C
from workbench import table_sink
from workbench.outdir import OutputExistsError, install, staging_dir
from workbench.table_sink import MemorySink, TableSink

# Storage order of a step row: the float columns, then the integer columns.
FLOAT_STEP_COLUMNS = ("t_s", "dt_s", "kernel_time_s")
INT_STEP_COLUMNS = tuple(c for c in C.STEP_COLUMNS if c not in FLOAT_STEP_COLUMNS)

STEPS_TABLE, REQUESTS_TABLE = "steps", "requests"  # the sink's table names (steps.parquet, requests.parquet)

# Reads a table's chunks in order, restricted to the given columns (TableSink.chunks of one table)
ChunkSource = Callable[[list[str]], Iterable[pd.DataFrame]]


class StepLog:
    """Step rows on their way to a table sink. `record`, `record_groups` and `close` mutate."""

    def __init__(self, sink: TableSink | None = None) -> None:
        self.sink = MemorySink() if sink is None else sink
        self.rows_per_chunk = table_sink.ROWS_PER_CHUNK
        self.num_rows = 0  # rows recorded
        self.num_saturated = 0  # rows with a non-empty queue (num_waiting > 0)
        self._floats = array("d")  # rows not yet handed to the sink, FLOAT_STEP_COLUMNS of each in turn
        self._ints = array("q")  # the same rows' INT_STEP_COLUMNS
        # a hybrid pool's per-group columns (name -> one value per buffered row), recorded beside every row
        self.group_columns: dict[str, list[int]] = {}

    @property
    def buffered_rows(self) -> int:
        """Rows recorded and not yet handed to the sink."""
        return len(self._ints) // _INTS_PER_ROW

    def record_groups(self, values: dict[str, int]) -> None:
        """Per-group values of the row just recorded (`group<i>_<part>` columns). Mutates."""
        for name, value in values.items():
            self.group_columns.setdefault(name, []).append(value)

    def record(self, floats: tuple[float, ...], ints: tuple[int, ...]) -> None:
        """Append one row; `floats` in FLOAT_STEP_COLUMNS order, `ints` in INT_STEP_COLUMNS order."""
        if len(ints) != _INTS_PER_ROW or len(floats) != _FLOATS_PER_ROW:  # the buffers are flat: no ragged rows
            raise ValueError(f"a step row has {len(floats)} float and {len(ints)} integer columns, not "
                             f"{_FLOATS_PER_ROW} and {_INTS_PER_ROW}")
        if len(self._ints) == _INTS_PER_ROW * self.rows_per_chunk:  # inline `buffered_rows`: once per step
            self._flush()
        self._floats.extend(floats)
        self._ints.extend(ints)
        self.num_rows += 1
        self.num_saturated += ints[_WAITING] > 0

    def record_rows(self, floats: np.ndarray, ints: np.ndarray) -> None:
        """Append rows in bulk, as `record` would one by one: float64 [n, FLOAT_STEP_COLUMNS] and int64
        [n, INT_STEP_COLUMNS] (a compiled step loop's buffers). Not beside per-group columns."""
        if floats.shape[1:] != (_FLOATS_PER_ROW,) or ints.shape[1:] != (_INTS_PER_ROW,) or \
                floats.shape[0] != ints.shape[0] or self.group_columns:
            raise ValueError(f"step rows of shapes {floats.shape} and {ints.shape}: want (n, {_FLOATS_PER_ROW}) and "
                             f"(n, {_INTS_PER_ROW}), and a log without per-group columns")
        done = 0
        while done < ints.shape[0]:
            if len(self._ints) == _INTS_PER_ROW * self.rows_per_chunk:
                self._flush()
            take = min(ints.shape[0] - done, self.rows_per_chunk - self.buffered_rows)
            part = ints[done:done + take]
            self._floats.frombytes(np.ascontiguousarray(floats[done:done + take], dtype=np.float64).tobytes())
            self._ints.frombytes(np.ascontiguousarray(part, dtype=np.int64).tobytes())
            self.num_rows += take
            self.num_saturated += int(np.count_nonzero(part[:, _WAITING] > 0))
            done += take

    def close(self) -> None:
        """Hand the last rows to the sink (an empty chunk when there were none, so the table exists)."""
        if self._ints or not self.num_rows:
            self._flush()

    def to_frame(self) -> pd.DataFrame:
        """The whole table, for a log kept in memory (a fleet's replicas merge theirs)."""
        self.close()
        return self.sink.frame(STEPS_TABLE)

    def _flush(self) -> None:
        n = self.buffered_rows
        floats = np.frombuffer(self._floats, dtype=np.float64).reshape(n, _FLOATS_PER_ROW)
        ints = np.frombuffer(self._ints, dtype=np.int64).reshape(n, _INTS_PER_ROW)
        data: dict[str, np.ndarray] = {}
        for j, name in enumerate(FLOAT_STEP_COLUMNS):
            data[name] = floats[:, j].copy()
        for j, name in enumerate(INT_STEP_COLUMNS):
            data[name] = ints[:, j].copy()
        for name, values in self.group_columns.items():
            data[name] = np.asarray(values, dtype=np.int64)
        self.sink.append(STEPS_TABLE, pd.DataFrame({name: data[name]
                                                    for name in (*C.STEP_COLUMNS, *self.group_columns)}))
        del floats, ints  # views of the buffers, which are replaced now
        self._floats, self._ints = array("d"), array("q")
        self.group_columns = {name: [] for name in self.group_columns}


_WAITING = INT_STEP_COLUMNS.index("num_waiting")
_INTS_PER_ROW, _FLOATS_PER_ROW = len(INT_STEP_COLUMNS), len(FLOAT_STEP_COLUMNS)


def _frame_source(frame: pd.DataFrame) -> ChunkSource:
    return lambda columns: (frame[columns],)


def summarize(steps: pd.DataFrame, requests: pd.DataFrame, *, capacity_slots: int,
              generated_tokens: int, extra: dict[str, Any]) -> dict[str, Any]:
    """The run-level metrics of docs/outputs.md from the two tables (`summarize_chunks` over one chunk each).

    `generated_tokens` counts every sample's tokens of the finished requests; `extra` supplies the
    keys the tables cannot give (prefix counters, kernel metrics, wall time)."""
    return summarize_chunks(_frame_source(steps), _frame_source(requests), capacity_slots=capacity_slots,
                            generated_tokens=generated_tokens, extra=extra)


# weighted by dt: (summary key, the per-step column or columns whose sum is weighted)
_SLOT_KEYS = tuple(zip(C.SLOT_COLUMNS, C.MEM_FRAC_KEYS, C.MEM_FRAC_SAT_KEYS, strict=True))
_STEP_INPUTS = ["t_s", "dt_s", "num_waiting", "num_running", *C.SLOT_COLUMNS, "largest_free_extent_slots",
                "logical_token_slots", "unshared_block_slots", "block_table_bytes", "preemptions", "cow_copies"]
_REQUEST_INPUTS = ["arrival_s", "first_token_s", "finish_s", "output_tokens", "status"]


def _count(source: ChunkSource, column: str, test: Callable[[pd.Series], np.ndarray]) -> tuple[int, int]:
    """(rows, rows passing `test`) of one column, over every chunk."""
    rows = hits = 0
    for chunk in source([column]):
        rows += len(chunk)
        hits += int(np.count_nonzero(test(chunk[column])))
    return rows, hits


def summarize_chunks(steps: ChunkSource, requests: ChunkSource, *, capacity_slots: int, generated_tokens: int,
                     extra: dict[str, Any]) -> dict[str, Any]:
    """The run-level metrics of docs/outputs.md from the two tables read chunk by chunk (two passes over
    each: the counts, then the sums), equal bit for bit to the metrics over the whole columns."""
    num_steps, num_sat = _count(steps, "num_waiting", lambda col: col.to_numpy() > 0)
    # imported here: exact_sums compiles with Numba, and a sweep worker sets Numba's threads before it loads
    from workbench.exact_sums import BufferedSum, PairwiseSum
    num_requests, num_finished = _count(requests, "status", lambda col: (col == "finished").to_numpy())
    step_sums = _StepSums(num_steps, num_sat, PairwiseSum, BufferedSum)
    speculative = "spec_verified_steps" in extra  # the steps have speculative decoding's columns
    stateful = C.STATE_COUNTERS[0] in extra  # the steps have a recurrent model's state columns
    for chunk in steps(_STEP_INPUTS + (["draft_slots", "accepted_tokens"] if speculative else [])
                       + (list(C.STATE_STEP_COLUMNS) if stateful else [])):
        step_sums.add(chunk)
    request_sums = _RequestSums(num_finished, PairwiseSum)
    for chunk in requests(_REQUEST_INPUTS):
        request_sums.add(chunk)
    request_sums.ttft_metrics()
    for chunk in requests(_REQUEST_INPUTS):  # a second pass: TTFT and TPOT are never held at once
        request_sums.add_tpot(chunk)

    out: dict[str, Any] = {"kv_slots": int(capacity_slots), "num_requests": int(num_requests),
                           "sim_time_s": step_sums.last_t_s}
    step_sums.metrics(out, capacity_slots)
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

    sim_time = out["sim_time_s"]
    out["throughput_req_s"] = num_finished / sim_time if sim_time > 0 else 0.0
    out["throughput_tok_s"] = generated_tokens / sim_time if sim_time > 0 else 0.0
    request_sums.metrics(out)
    out["num_finished"] = int(num_finished)
    out["num_rejected"] = int(num_requests - num_finished)
    # the whole workload's, so a fleet's replicas leave it out of `extra` and report 0 of their own
    out["num_failed_rows_dropped"] = int(extra.get("num_failed_rows_dropped", 0))
    for key in ("kernel_backend", "kernel_time_s", "kernel_gbps", "verify_max_rel_err", "sim_wall_s"):
        out[key] = extra[key]
    # speculation's and a recurrent model's counters come with `extra`, the draft and state slots' shares from the
    # steps; a run has them only where it has those
    optional = {**extra, **out}
    return {**{key: out[key] for key in C.SUMMARY_KEYS},
            **{key: optional[key] for key in C.SPEC_SUMMARY_KEYS + C.STATE_SUMMARY_KEYS if key in optional}}


class _StepSums:
    """The step table's sums, fed chunk by chunk in order (`add` mutates). Each float sum is NumPy's over
    the whole column (PairwiseSum), each mean of an integer column NumPy's cast-and-buffer sum."""

    def __init__(self, num_steps: int, num_sat: int, PairwiseSum, BufferedSum) -> None:  # noqa: N803 - classes
        self.num_steps, self.num_sat = num_steps, num_sat
        self.last_t_s = 0.0
        self.dt = PairwiseSum(num_steps)
        self.dt_sat = PairwiseSum(num_sat)
        self.slot_dt = {col: PairwiseSum(num_steps) for col in C.SLOT_COLUMNS}
        self.slot_dt_sat = {col: PairwiseSum(num_sat) for col in C.SLOT_COLUMNS}
        self.frag = PairwiseSum(num_steps)
        self.logical_dt, self.token_dt = PairwiseSum(num_steps), PairwiseSum(num_steps)
        self.allocated_dt, self.unshared_dt = PairwiseSum(num_steps), PairwiseSum(num_steps)
        self.table_bytes_dt = PairwiseSum(num_steps)
        self.state_dt = {col: PairwiseSum(num_steps) for col in C.STATE_STEP_COLUMNS}
        self.stateful = False
        self.running, self.saturated, self.running_sat = BufferedSum(), BufferedSum(), BufferedSum()
        self.max_running = 0
        self.running_sat_total = 0  # exact: an integer sum
        self.preemptions = self.cow_copies = 0
        self.draft_dt = PairwiseSum(num_steps)  # speculative decoding's draft slots, weighted by dt
        self.speculative = False  # the steps have speculative decoding's columns

    def add(self, chunk: pd.DataFrame) -> None:
        if not len(chunk):
            return
        col = {name: chunk[name].to_numpy() for name in _STEP_INPUTS}
        dt = col["dt_s"]
        sat = col["num_waiting"] > 0
        self.last_t_s = float(col["t_s"][-1])
        self.dt.add(dt)
        self.dt_sat.add(dt[sat])
        for name in C.SLOT_COLUMNS:
            weighted = col[name].astype(np.float64) * dt
            self.slot_dt[name].add(weighted)
            self.slot_dt_sat[name].add(col[name][sat].astype(np.float64) * dt[sat])
        # free memory in any extent: what a contiguous request could have used if it were one piece
        unallocated = (col["free_slots"] + col["external_frag_slots"]).astype(np.float64)
        largest = col["largest_free_extent_slots"].astype(np.float64)
        self.frag.add(np.where(unallocated > 0, 1.0 - largest / np.maximum(unallocated, 1.0), 0.0))
        self.logical_dt.add(col["logical_token_slots"].astype(np.float64) * dt)
        self.token_dt.add(col["token_slots"].astype(np.float64) * dt)
        allocated = col["token_slots"] + col["reserved_slots"] + col["internal_frag_slots"]
        self.allocated_dt.add(allocated.astype(np.float64) * dt)
        self.unshared_dt.add(col["unshared_block_slots"].astype(np.float64) * dt)
        self.table_bytes_dt.add(col["block_table_bytes"].astype(np.float64) * dt)
        running = col["num_running"]
        self.running.add(running)
        self.saturated.add(sat)
        self.running_sat.add(running[sat])
        self.max_running = max(self.max_running, int(running.max()))
        self.running_sat_total += int(running[sat].sum())
        if "accepted_tokens" in chunk:  # speculative decoding: a request samples its accepted drafts too
            self.running_sat_total += int(chunk["accepted_tokens"].to_numpy()[sat].sum())
            self.speculative = True
            self.draft_dt.add(chunk["draft_slots"].to_numpy().astype(np.float64) * dt)
        if C.STATE_STEP_COLUMNS[0] in chunk:  # a recurrent model: its states' slot-seconds
            self.stateful = True
            for state_col in C.STATE_STEP_COLUMNS:
                self.state_dt[state_col].add(chunk[state_col].to_numpy().astype(np.float64) * dt)
        self.preemptions += int(col["preemptions"].sum())
        self.cow_copies += int(col["cow_copies"].sum())

    def metrics(self, out: dict[str, Any], capacity_slots: int) -> None:
        """Mutates `out`: the step table's summary keys."""
        dt_total, dt_sat_total = self.dt.total(), self.dt_sat.total()
        for col, key, key_sat in _SLOT_KEYS:
            # a pool no step used (a replica the router sent nothing) was free all along
            idle = 1.0 if col == "free_slots" else 0.0
            out[key] = self.slot_dt[col].total() / dt_total / capacity_slots if dt_total > 0 else idle
            # over the saturated steps: 0 when there were none (saturated_step_frac = 0 says so), never NaN
            out[key_sat] = self.slot_dt_sat[col].total() / dt_sat_total / capacity_slots if dt_sat_total > 0 else 0.0
        n = self.num_steps
        out["ext_frag_index"] = self.frag.total() / n if n else 0.0
        logical, token = self.logical_dt.total(), self.token_dt.total()
        out["sharing_saving_frac"] = 1.0 - token / logical if logical > 0 else 0.0
        unshared = self.unshared_dt.total()
        out["block_sharing_saving_frac"] = 1.0 - self.allocated_dt.total() / unshared if unshared > 0 else 0.0
        out["block_table_bytes_mean"] = self.table_bytes_dt.total() / dt_total if dt_total > 0 else 0.0
        out["mean_batch_size"] = self.running.total() / n if n else 0.0
        out["max_batch_size"] = self.max_running
        out["saturated_step_frac"] = self.saturated.total() / n if n else 0.0
        out["mean_batch_size_sat"] = self.running_sat.total() / self.num_sat if self.num_sat else 0.0
        # every running sequence samples one token per step (a prefill its first, a recompute its next)
        out["throughput_tok_s_sat"] = float(self.running_sat_total) / dt_sat_total if dt_sat_total > 0 else 0.0
        if self.speculative:
            out["mem_draft_frac"] = self.draft_dt.total() / dt_total / capacity_slots if dt_total > 0 else 0.0
        if self.stateful:
            for state_col, key in zip(C.STATE_STEP_COLUMNS, C.STATE_MEM_FRAC_KEYS, strict=True):
                out[key] = self.state_dt[state_col].total() / dt_total / capacity_slots if dt_total > 0 else 0.0
        out["num_preemptions"] = self.preemptions
        out["cow_copies"] = self.cow_copies


class _RequestSums:
    """The finished requests' latency metrics, fed chunk by chunk in order, in two passes over the request
    table (`add`, `ttft_metrics`, then `add_tpot`; all mutate): the normalized latency's mean in NumPy's
    order and TTFT kept for its percentiles, then TPOT kept for its own (8 bytes per finished request,
    one of the two arrays at a time: a million-request run holds 8 MB, not 16)."""

    def __init__(self, num_finished: int, PairwiseSum) -> None:  # noqa: N803 - a class
        self.num_finished = num_finished
        self.normalized = PairwiseSum(num_finished)
        self.kept = np.empty(num_finished)  # [num_finished] TTFT, then TPOT, filled in request order
        self._num_kept = 0
        self._metrics: dict[str, float] = {}

    def add(self, chunk: pd.DataFrame) -> None:
        arrival, first, finish, output = _finished(chunk)
        self.normalized.add((finish - arrival) / output)
        self._keep(first - arrival)

    def ttft_metrics(self) -> None:
        """The TTFT percentiles, once every chunk was added; empties the array for `add_tpot`."""
        ttft = self.kept[:self._num_kept]
        self._metrics["ttft_p50_s"], self._metrics["ttft_p99_s"] = _percentile(ttft, 50), _percentile(ttft, 99)
        self._num_kept = 0

    def add_tpot(self, chunk: pd.DataFrame) -> None:
        _, first, finish, output = _finished(chunk)
        multi = output > 1  # TPOT of the requests with more than one output token
        self._keep((finish[multi] - first[multi]) / (output[multi] - 1))

    def _keep(self, values: np.ndarray) -> None:
        self.kept[self._num_kept:self._num_kept + values.shape[0]] = values
        self._num_kept += values.shape[0]

    def metrics(self, out: dict[str, Any]) -> None:
        """Mutates `out`: the request table's summary keys."""
        n = self.num_finished
        out["normalized_latency_s_per_tok"] = self.normalized.total() / n if n else 0.0
        tpot = self.kept[:self._num_kept]
        out["ttft_p50_s"], out["ttft_p99_s"] = self._metrics["ttft_p50_s"], self._metrics["ttft_p99_s"]
        out["tpot_p50_s"], out["tpot_p99_s"] = _percentile(tpot, 50), _percentile(tpot, 99)


def _finished(chunk: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Arrival, first token and finish times and output tokens of the chunk's finished requests."""
    done = (chunk["status"] == "finished").to_numpy()
    return (chunk["arrival_s"].to_numpy()[done], chunk["first_token_s"].to_numpy()[done],
            chunk["finish_s"].to_numpy()[done], chunk["output_tokens"].to_numpy()[done])


def _percentile(values: np.ndarray, q: float) -> float:
    """np.percentile, partitioning `values` in place (their order is lost, the figure is the same: it
    depends on the values alone), so a million values are not copied. 0 of no values (no request finished,
    or none had a second token), as every figure with nothing to measure is."""
    return float(np.percentile(values, q, overwrite_input=True)) if values.size else 0.0


def summary_problem(summary: Any) -> str | None:
    """Why `summary` (a summary.json read back) is not what `summarize` writes, None when it is: every key
    of columns.SUMMARY_KEYS, text where text belongs, and elsewhere a finite number. A kept sweep point is
    trusted only when this is None."""
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
        elif not math.isfinite(value):
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
        write_json(staged / "config.json", config)
        table_sink.write_frame(staged / "steps.parquet", steps)
        table_sink.write_frame(staged / "requests.parquet", requests)
        write_json(staged / "summary.json", summary)
        install(staged, out_dir, replace=replace)
    except OutputExistsError:  # the message names `staged`, where the new result is kept
        raise
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


def write_json(path: Path, data: dict[str, Any]) -> None:
    """config.json and summary.json: indented, keys in the order given."""
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
