"""Output streams that fail never cost a result: stdout or stderr closed, on a full device or cut off by its
reader, with or without a progress bar, for a run and a sweep. The files are complete; the exit status says
what happened to the stream (0 when it was closed and nothing was lost, 141 when the reader went away, 1 with one
line when a device was full); never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from workbench.paths import REPO_ROOT

TINY = ["--model", "custom:layers=2,kv_heads=2,heads=4,head_dim=16,max_model_len=512", "--kv-slots", "2048",
        "--kernel", "none", "--workload", "fixed:prompt=8,output=4", "--num-requests", "3"]
FULL = os.path.exists("/dev/full")
TIMEOUT_S = 300

# redirection -> (exit status, what stderr must then hold: None = nothing to check, "" = nothing)
STREAMS = {
    "stdout closed": ("1>&-", 0, None),
    "stderr closed": ("2>&-", 0, None),
    "both closed": ("1>&- 2>&-", 0, None),
    "stdout full": ("1>/dev/full", 1, "error: cannot write to standard output: No space left on device"),
    "stderr full": ("2>/dev/full", 0, None),
    "stdout cut off": ("| true", 128 + 13, ""),
}


def shell(command: list[str], redirect: str, stderr_file: str) -> subprocess.CompletedProcess:
    quoted = " ".join(f"'{arg}'" for arg in command)
    if redirect == "| true":  # the reader exits at once; the exit status of the left side is what counts
        line = f"set -o pipefail; {quoted} 2>'{stderr_file}' | true; echo $? > '{stderr_file}.rc'"
    else:
        line = f"{quoted} {redirect if '2>' in redirect else redirect + f' 2>{stderr_file}'}; " \
               f"echo $? > '{stderr_file}.rc'"
    return subprocess.run(["bash", "-c", line], cwd=REPO_ROOT, timeout=TIMEOUT_S)


# the quick run gives a sweep the streams its own writers meet (its table on a full or cut-off stdout, its
# progress bar on a full stderr); a closed stream is handled as for a run, and the full run checks it too
SWEEP_QUICK = {"stdout full", "stdout cut off", "stderr full"}
CASES = [pytest.param(tool, stream, id=f"{tool}-{stream}",
                      marks=pytest.mark.slow if tool == "sweep" and stream not in SWEEP_QUICK else ())
         for tool in ("run", "sweep") for stream in sorted(STREAMS)]


@pytest.mark.skipif(not FULL or sys.platform != "linux", reason="needs /dev/full and bash")
@pytest.mark.parametrize(("tool", "stream"), CASES)
def test_a_failing_output_stream_keeps_the_results(tmp_path, stream, tool):
    redirect, status, message = STREAMS[stream]
    out = tmp_path / "out"
    if tool == "run":
        command = [sys.executable, "-m", "workbench.run", *TINY, "--progress", "--out", str(out)]
    else:
        spec = tmp_path / "tiny.yaml"
        base = {k.removeprefix("--").replace("-", "_"): v for k, v in zip(TINY[::2], TINY[1::2], strict=True)}
        base = {k: int(v) if v.isdigit() else v for k, v in base.items()}
        spec.write_text(yaml.safe_dump({"name": "streams", "base": base, "axes": {"seed": [0, 1]}}))
        command = [sys.executable, "-m", "workbench.sweep", str(spec), "-j", "1", "--out", str(out)]
    err_file = tmp_path / "stderr.txt"
    shell(command, redirect, str(err_file))
    assert int((tmp_path / "stderr.txt.rc").read_text()) == status
    if tool == "run":
        assert json.loads((out / "summary.json").read_text())["num_finished"] == 3
    else:
        assert (out / "summary.parquet").is_file() and len(list((out / "points").iterdir())) == 2
    err = err_file.read_text() if err_file.exists() else ""
    assert "Traceback" not in err
    if message is not None:
        lines = [line for line in err.splitlines() if line.startswith("error")]
        assert (lines == [] if message == "" else lines[0].startswith(message)), err
