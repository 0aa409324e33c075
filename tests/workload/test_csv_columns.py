"""A trace's numeric columns are parsed once per content: the same bytes give the same column without a second
parse, other bytes (the file rewritten) are parsed afresh, and no caller can change what a later one reads."""

from __future__ import annotations

import pytest

from workbench.errors import WorkloadError
from workbench.workload import csvio


def _write(path, rows):
    path.write_text("input_len,output_len\n" + "".join(f"{a},{b}\n" for a, b in rows))
    return path


def test_a_column_is_parsed_once_per_content(tmp_path, monkeypatch):
    path = _write(tmp_path / "t.csv", [(3, 4), (5, 6)])
    first = csvio.numbers(path, csvio.read_csv(path), "input_len", integer=True)
    first[0] = 99  # the caller's own array
    parses = []
    monkeypatch.setattr(csvio.pd, "to_numeric", lambda *a, **k: parses.append(1) or pytest.fail("parsed again"))
    again = csvio.numbers(path, csvio.read_csv(path), "input_len", integer=True)
    assert again.tolist() == [3, 5] and not parses
    monkeypatch.undo()
    _write(path, [(7, 8), (9, 10)])  # rewritten: new content, parsed afresh
    assert csvio.numbers(path, csvio.read_csv(path), "input_len", integer=True).tolist() == [7, 9]
    as_float = csvio.numbers(path, csvio.read_csv(path), "input_len", integer=False)
    assert as_float.dtype.kind == "f" and as_float.tolist() == [7.0, 9.0]


def test_a_bad_value_is_reported_every_time(tmp_path):
    path = _write(tmp_path / "bad.csv", [(3, 4), ("x", 6)])
    for _ in range(2):
        with pytest.raises(WorkloadError, match=r"bad.csv:3: field .input_len."):
            csvio.numbers(path, csvio.read_csv(path), "input_len", integer=True)
