"""Readers for the published CSV traces (docs/workloads.md), byte-for-byte as published, columns found by name.

- `azure`: `TIMESTAMP,ContextTokens,GeneratedTokens`, ISO 8601 timestamps with 100 ns ticks.
- `burstgpt`: `Timestamp` (s), `Request tokens`, `Response tokens`; the other published columns
  (`Model`, `Total tokens`, `Log Type`, and in release v2.0 `Session ID`, `Elapsed time` inserted at
  positions 2-3) are found by name. With a `Session ID` column, a turn whose prompt can hold the
  session's previous turn (its prompt and answer) starts with exactly that context; the rest of the
  prompt is new. A turn shorter than that (the client truncated the history) is all new content.
- `lengths`: input/output token pairs without timestamps; arrivals are synthesized (see `read_lengths`).
Traces without prefix information get one unique segment per request. Arrival times are relative to
the first row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from workbench.errors import WorkloadError
from workbench.workload.csvio import check_non_decreasing, numbers, read_csv, require_columns, with_offsets
from workbench.workload.distributions import arrival_times_s
from workbench.workload.failed import FAILED_CHOICES, settle_failed
from workbench.workload.request import Segment
from workbench.workload.spec import WorkloadSpec
from workbench.workload.table import OutputRef, Part, RequestTable, content_keys

# (prompt column, output column) of the shared length files, tried in this order. Alpaca's
# `input_tokens` is its optional input field, not the prompt, so `prompt_tokens` is tried first.
LENGTH_COLUMNS = (
    ("prompt_tokens", "output_tokens"),  # alpaca-5000-subset
    ("input_tokens", "output_tokens"),  # sharegpt-vllm-sosp23-lengths
    ("num_prefill_tokens", "num_decode_tokens"),  # arxiv-summarization-vidur-lengths
    ("ContextTokens", "GeneratedTokens"),  # lmsys-apex-lengths (and the Azure files)
)


def read_azure(path: Path, spec: WorkloadSpec) -> RequestTable:
    spec.check_keys(("failed",))
    table = read_csv(path)
    require_columns(path, table, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    ns = np.concatenate([_iso_ns(path, table.lines[at:], raw)
                         for at, raw in with_offsets(table.column_chunks("TIMESTAMP"))])
    check_non_decreasing(path, table, "TIMESTAMP", ns)
    arrival_s = (ns - ns[0]) / 1e9
    prompt = numbers(path, table, "ContextTokens", integer=True)
    output = numbers(path, table, "GeneratedTokens", integer=True)
    kept, prompt, output, notes, dropped = settle_failed(path, table.lines, prompt, output, failed=_failed(spec),
                                                prompt_field="ContextTokens", output_field="GeneratedTokens")
    return RequestTable(arrival_s[kept], prompt, output, notes=notes, failed_rows_dropped=dropped)


def _iso_ns(path: Path, lines: np.ndarray, raw: pd.Series) -> np.ndarray:
    """ISO 8601 timestamps as int64 ns since the epoch, [rows]; an offset, when given, is honoured (UTC)."""
    stamps = pd.to_datetime(raw, format="ISO8601", errors="coerce", utc=True)
    # datetime64[ns] spans the years 1678-2261; anything outside is not a trace timestamp either
    bad = (stamps.isna() | (stamps < pd.Timestamp("1678-01-01", tz="UTC"))
           | (stamps >= pd.Timestamp("2262-01-01", tz="UTC"))).to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise WorkloadError(path, int(lines[i]), raw.name, "an ISO 8601 timestamp", raw.iloc[i])
    return stamps.dt.tz_localize(None).dt.as_unit("ns").to_numpy().astype(np.int64)


def read_burstgpt(path: Path, spec: WorkloadSpec) -> RequestTable:
    spec.check_keys(("failed",))
    csv_table = read_csv(path)
    require_columns(path, csv_table, ("Timestamp", "Request tokens", "Response tokens"))
    arrival_s = numbers(path, csv_table, "Timestamp", integer=False)
    check_non_decreasing(path, csv_table, "Timestamp", arrival_s)
    prompt = numbers(path, csv_table, "Request tokens", integer=True)
    output = numbers(path, csv_table, "Response tokens", integer=True)
    was_failed = output == 0  # [rows]
    kept, prompt, output, notes, dropped = settle_failed(path, csv_table.lines, prompt, output, failed=_failed(spec),
                                                prompt_field="Request tokens", output_field="Response tokens")
    table = RequestTable(arrival_s[kept] - arrival_s[0], prompt, output, notes=notes, failed_rows_dropped=dropped)
    if "Session ID" in csv_table.columns:
        session = csv_table.text("Session ID")[kept]
        _session_content(table, [s or None for s in session.tolist()], was_failed[kept])
    return table


def _session_content(table: RequestTable, session: list[str | None], was_failed: np.ndarray) -> None:
    """Fill `table.content` and `table.session_id` from session ids (mutates `table`)."""
    keys = content_keys("burstgpt-turn", np.arange(len(table))).tolist()
    prompt = table.prompt_tokens.tolist()
    output = table.output_tokens.tolist()
    content: list[tuple[Part, ...]] = []
    last_turn: dict[str, int] = {}  # session id -> its latest non-failed row
    num_extended = 0
    for row, sid in enumerate(session):
        parts: tuple[Part, ...] = (Segment(keys[row], prompt[row]),)
        prev = last_turn.get(sid) if sid is not None else None
        if prev is not None and prompt[prev] + output[prev] <= prompt[row]:
            new_tokens = prompt[row] - prompt[prev] - output[prev]
            parts = (*content[prev], OutputRef(prev, output[prev]))
            if new_tokens:
                parts += (Segment(keys[row], new_tokens),)
            num_extended += 1
        content.append(parts)
        if sid is not None and not was_failed[row]:
            last_turn[sid] = row
    table.content = content
    table.session_id = session
    num_sessions = len({s for s in session if s is not None})
    table.notes.append(f"{num_sessions} sessions; {num_extended} turns start with their session's previous turn")


def read_lengths(path: Path, spec: WorkloadSpec, *, seed: int, rate: float, max_model_len: int) -> RequestTable:
    """Length pairs in a seeded random order (the vLLM benchmarks sample the dataset at random) with
    gamma arrivals at `rate` (`cv=1`, Poisson, unless given). `filter=max_model_len` (the default) drops
    pairs with input + output > max_model_len as the vLLM paper did; `filter=none` keeps them."""
    spec.check_keys(("failed", "filter", "cv"))
    table = read_csv(path)
    pair = next((p for p in LENGTH_COLUMNS if p[0] in table.columns and p[1] in table.columns), None)
    if pair is None:
        expected = " or ".join(f"{a},{b}" for a, b in LENGTH_COLUMNS)
        raise WorkloadError(path, 1, None, f"a header with the columns {expected}", ",".join(table.columns))
    prompt = numbers(path, table, pair[0], integer=True)
    output = numbers(path, table, pair[1], integer=True)
    # speculative decoding: the drafts each of a request's verify steps accepts (docs/speculative.md)
    accepted = numbers(path, table, "accepted", integer=True) if "accepted" in table.columns else None
    kept, prompt, output, notes, dropped = settle_failed(path, table.lines, prompt, output, failed=_failed(spec),
                                                prompt_field=pair[0], output_field=pair[1])
    if accepted is not None:
        accepted = accepted[kept]
    if spec.get_choice("filter", "max_model_len", ("max_model_len", "none")) == "max_model_len":
        fits = prompt + output <= max_model_len
        if not fits.all():
            notes.append(f"dropped {int((~fits).sum())} of {len(fits)} pairs with {pair[0]} + {pair[1]} > "
                         f"max_model_len {max_model_len}; filter=none keeps them")
        prompt, output = prompt[fits], output[fits]
        accepted = None if accepted is None else accepted[fits]
        if len(prompt) == 0:
            raise WorkloadError(path, None, pair[0], f"at least one pair within max_model_len {max_model_len}")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(prompt))
    arrival_s = arrival_times_s(rng, rate, spec.get_float("cv", 1.0), num=len(prompt))
    return RequestTable(arrival_s, prompt[order], output[order], notes=notes, failed_rows_dropped=dropped,
                        accepted=None if accepted is None else accepted[order])


def _failed(spec: WorkloadSpec) -> str:
    return spec.get_choice("failed", "drop", FAILED_CHOICES)
