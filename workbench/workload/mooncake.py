"""Reader for the Mooncake (FAST'25) JSONL traces: one object per line with `timestamp` (ms),
`input_length`, `output_length` and `hash_ids`, remapped prefix block ids of 512 tokens each.

Prompt content is the hash ids expanded into segments: id h covers 512 tokens whose ids are a function
of h alone (the last block is cut to the prompt's remainder), so two prompts share exactly the tokens
the trace says they share, and any block size dividing 512 sees the same sharing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from workbench.errors import WorkloadError
from workbench.intmath import cdiv
from workbench.workload.failed import FAILED_CHOICES, settle_failed
from workbench.workload.request import Segment
from workbench.workload.spec import WorkloadSpec
from workbench.workload.table import Part, RequestTable, content_keys
from workbench.workload.trace_bytes import read_trace_bytes

HASH_BLOCK_TOKENS = 512
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


def read_mooncake(path: Path, spec: WorkloadSpec) -> RequestTable:
    spec.check_keys(("failed",))
    rows = _parse_lines(path)
    lines = np.array([r[0] for r in rows], dtype=np.int64)  # [rows] line number of each row
    stamp_ms = np.array([r[1] for r in rows], dtype=np.float64)
    back = np.flatnonzero(np.diff(stamp_ms) < 0)
    if len(back):
        i = int(back[0]) + 1
        raise WorkloadError(path, int(lines[i]), "timestamp", f"a time not before the previous row's "
                            f"({rows[i - 1][1]}): timestamps must not go backwards", rows[i][1])
    prompt = np.array([r[2] for r in rows], dtype=np.int64)
    output = np.array([r[3] for r in rows], dtype=np.int64)
    kept, prompt, output, notes, dropped = settle_failed(path, lines, prompt, output, failed=spec.get_choice(
        "failed", "drop", FAILED_CHOICES), prompt_field="input_length", output_field="output_length")
    hash_ids = [rows[i][4] for i in kept.tolist()]
    all_ids = np.fromiter((h for ids in hash_ids for h in ids), dtype=np.int64)
    keys = iter(content_keys("mooncake-block", all_ids).tolist())
    content: list[tuple[Part, ...]] = []
    for row, (ids, length) in enumerate(zip(hash_ids, prompt.tolist(), strict=True)):
        if not ids:  # a failed row kept with failed=keep: its 1-token prompt is unique
            content.append((Segment(int(content_keys("mooncake-empty", np.array([row]))[0]), length),))
            continue
        last = length - HASH_BLOCK_TOKENS * (len(ids) - 1)  # tokens in the last, possibly cut, block
        content.append(tuple(Segment(next(keys), HASH_BLOCK_TOKENS if j < len(ids) - 1 else last)
                             for j in range(len(ids))))
    return RequestTable(stamp_ms[kept] / 1000.0, prompt, output, content, notes=notes, failed_rows_dropped=dropped)


def _parse_lines(path: Path) -> list[tuple[int, float, int, int, list[int]]]:
    """(line, timestamp_ms, input_length, output_length, hash_ids) per non-blank line."""
    try:
        text = read_trace_bytes(path).decode("utf-8")  # by content: plain, gzip, bzip2 or xz
    except UnicodeDecodeError as exc:
        raise WorkloadError(path, None, None, "UTF-8 text", exc.reason) from None
    rows = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            raise WorkloadError(path, number, None, "one JSON object per line", line) from None
        if not isinstance(obj, dict):
            raise WorkloadError(path, number, None, "a JSON object", line)
        for field in _FIELDS:
            if field not in obj:
                raise WorkloadError(path, number, field, f"the field {field!r}", line)
        stamp = obj["timestamp"]
        if not _is_number(stamp) or not 0 <= stamp < float("inf"):
            raise WorkloadError(path, number, "timestamp", "a finite non-negative number of ms", stamp)
        for field in ("input_length", "output_length"):
            if not _is_int(obj[field]) or not 0 <= obj[field] < 2**31:
                raise WorkloadError(path, number, field, "a non-negative integer", obj[field])
        ids = obj["hash_ids"]
        if not isinstance(ids, list) or not all(_is_int(h) and 0 <= h < 2**63 for h in ids):
            raise WorkloadError(path, number, "hash_ids", "a list of non-negative integers", ids)
        need = cdiv(obj["input_length"], HASH_BLOCK_TOKENS)
        if len(ids) != need:
            raise WorkloadError(path, number, "hash_ids", f"ceil(input_length / {HASH_BLOCK_TOKENS}) = {need} ids",
                                len(ids))
        rows.append((number, float(stamp), obj["input_length"], obj["output_length"], ids))
    if not rows:
        raise WorkloadError(path, 1, None, "at least one JSON line; the file is empty")
    return rows


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)

