"""Every malformed case of docs/workloads.md gives one WorkloadError naming file, line and field; the CLI prints
it as one line, exits 2 and writes nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from workbench.config import RunConfig
from workbench.errors import WorkloadError
from workbench.workload import build_workload
from workbench.workload.__main__ import main

AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
T0, T1 = "2023-11-16 18:15:46.6805900", "2023-11-16 18:15:50.9951690"
BG = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
LN = "input_tokens,output_tokens\n"


def _mc(stamp, inp, out, ids):
    return f'{{"timestamp": {stamp}, "input_length": {inp}, "output_length": {out}, "hash_ids": {ids}}}\n'


# (format, file text, line, field)
CASES = {
    "azure missing column": ("azure", "TIMESTAMP,ContextTokens\n" + f"{T0},5\n", 1, "GeneratedTokens"),
    "azure non-numeric": ("azure", AZ + f"{T0},5,6\n{T1},abc,6\n", 3, "ContextTokens"),
    "azure negative": ("azure", AZ + f"{T0},5,-6\n", 2, "GeneratedTokens"),
    "azure NaN": ("azure", AZ + f"{T0},5,6\n{T1},NaN,6\n", 3, "ContextTokens"),
    "azure empty field": ("azure", AZ + f"{T0},,6\n", 2, "ContextTokens"),
    "azure fractional tokens": ("azure", AZ + f"{T0},5.5,6\n", 2, "ContextTokens"),
    "azure zero prompt": ("azure", AZ + f"{T0},5,6\n{T1},0,6\n", 3, "ContextTokens"),
    "azure bad timestamp": ("azure", AZ + f"{T0},5,6\nyesterday,5,6\n", 3, "TIMESTAMP"),
    "azure backwards": ("azure", AZ + f"{T1},5,6\n{T0},5,6\n", 3, "TIMESTAMP"),
    "azure too many fields": ("azure", AZ + f"{T0},5,6\n{T1},5,6,7\n", 3, None),
    "azure empty file": ("azure", "", 1, None),
    "azure header only": ("azure", AZ, 2, None),
    "azure blank line inside": ("azure", AZ + f"{T0},5,6\n\n{T1},5,6\n", 3, "TIMESTAMP"),
    "burstgpt missing column": ("burstgpt", "Timestamp,Model,Response tokens\n5,ChatGPT,6\n", 1, "Request tokens"),
    "burstgpt backwards": ("burstgpt", BG + "50,ChatGPT,4,5,9,x\n40,ChatGPT,4,5,9,x\n", 3, "Timestamp"),
    "burstgpt inf": ("burstgpt", BG + "5,ChatGPT,4,5,9,x\ninf,ChatGPT,4,5,9,x\n", 3, "Timestamp"),
    "burstgpt negative": ("burstgpt", BG + "5,ChatGPT,-4,5,9,x\n", 2, "Request tokens"),
    "burstgpt all failed": ("burstgpt", BG + "5,ChatGPT,0,0,0,x\n", None, "Response tokens"),
    "lengths no known columns": ("lengths", "a,b\n1,2\n", 1, None),
    "lengths nan": ("lengths", LN + "3,4\nnan,4\n", 3, "input_tokens"),
    "lengths zero prompt": ("lengths", LN + "0,4\n", 2, "input_tokens"),
    "lengths empty file": ("lengths", "", 1, None),
    "mooncake bad json": ("mooncake", _mc(0, 5, 6, [0]) + "{not json\n", 2, None),
    "mooncake missing field": ("mooncake", '{"timestamp": 0, "input_length": 5, "output_length": 6}\n', 1,
                               "hash_ids"),
    "mooncake not an object": ("mooncake", "[1, 2]\n", 1, None),
    "mooncake string length": ("mooncake", _mc(0, '"5"', 6, [0]), 1, "input_length"),
    "mooncake bool length": ("mooncake", _mc(0, 5, "true", [0]), 1, "output_length"),
    "mooncake NaN timestamp": ("mooncake", _mc("NaN", 5, 6, [0]), 1, "timestamp"),
    "mooncake negative": ("mooncake", _mc(0, 5, -6, [0]), 1, "output_length"),
    "mooncake backwards": ("mooncake", _mc(3000, 5, 6, [0]) + _mc(0, 5, 6, [1]), 2, "timestamp"),
    "mooncake too few hash ids": ("mooncake", _mc(0, 1025, 6, [0, 1]), 1, "hash_ids"),
    "mooncake bad hash id": ("mooncake", _mc(0, 5, 6, '["a"]'), 1, "hash_ids"),
    "mooncake zero prompt": ("mooncake", _mc(0, 0, 6, []), 1, "input_length"),
    "mooncake empty file": ("mooncake", "\n", 1, None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_file_names_file_line_and_field(tmp_path, case):
    fmt, text, line, field = CASES[case]
    path = tmp_path / "trace.txt"
    path.write_text(text)
    with pytest.raises(WorkloadError) as info:
        build_workload(RunConfig(workload=f"{fmt}:{path}"))
    err = info.value
    assert (err.file, err.line, err.field) == (str(path), line, field)
    assert str(path) in str(err) and "\n" not in str(err)


def test_non_utf8_file(tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(AZ.encode() + b"\xff\xfe,1,2\n")
    with pytest.raises(WorkloadError, match="UTF-8"):
        build_workload(RunConfig(workload=f"azure:{path}"))


@pytest.mark.parametrize("spec,field", [
    ("parquet:x.parquet", "workload"), ("nonsense", "workload"), ("azure:", "workload"),
    ("azure:/no/such/file.csv", "path"), ("fixed:prompt=0", "prompt"), ("fixed:prompt=abc", "prompt"),
    ("fixed:colour=red", "colour"), ("sharegpt-like:cv=-1", "cv"), ("multi-turn:lengths=wiki", "lengths"),
    ("system-prompt:system=4000", "system"), ("fixed:prompt", "workload"),
])
def test_bad_spec(spec, field):
    with pytest.raises(WorkloadError) as info:
        build_workload(RunConfig(workload=spec))
    assert info.value.field == field and info.value.file == spec


def test_cli_prints_one_line_exits_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    fmt, text, line, field = CASES["azure backwards"]
    path = tmp_path / "trace.csv"
    path.write_text(text)
    monkeypatch.chdir(tmp_path)
    assert main(["describe", f"{fmt}:{path}"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"error: {path}:{line}: field '{field}'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.csv"]


def test_cli_module_has_no_traceback(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text(AZ + f"{T0},x,1\n")
    proc = subprocess.run([sys.executable, "-m", "workbench.workload", "describe", f"azure:{path}"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"error: {path}:2: field 'ContextTokens': expected a non-negative integer, got 'x'"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.csv"]


@pytest.mark.parametrize("stamp", ["2023-11-16T18:15:47+01:00", "99999-01-01", "2500-01-01 00:00:00", "1"])
def test_azure_timestamps_outside_what_a_trace_holds(tmp_path, stamp):
    path = tmp_path / "t.csv"
    path.write_text(AZ + f"{T0},5,6\n{stamp},5,6\n")
    if stamp.endswith("+01:00"):  # an explicit offset is honoured: 18:15:47+01:00 is 17:15:47 UTC, earlier
        with pytest.raises(WorkloadError, match="backwards") as info:
            build_workload(RunConfig(workload=f"azure:{path}"))
    else:
        with pytest.raises(WorkloadError, match="ISO 8601") as info:
            build_workload(RunConfig(workload=f"azure:{path}"))
    assert (info.value.line, info.value.field) == (3, "TIMESTAMP")


def test_azure_sub_microsecond_ticks(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(AZ + "2023-11-16 18:15:46.0000000,5,6\n2023-11-16 18:15:46.0000001,5,6\n")
    assert build_workload(RunConfig(workload=f"azure:{path}"))[1].arrival_s == pytest.approx(1e-7)


def test_rate_cannot_rescale_a_single_instant(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(AZ + f"{T0},5,6\n{T0},7,8\n")
    assert len(build_workload(RunConfig(workload=f"azure:{path}"))) == 2
    with pytest.raises(WorkloadError) as info:
        build_workload(RunConfig(workload=f"azure:{path}", rate=2.0))
    assert info.value.field == "rate"
