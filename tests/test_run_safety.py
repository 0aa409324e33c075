"""`python -m workbench.run`: every bad value is one line and exit 2 before any work; a result directory
is written whole or not at all and never replaced without --force."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pandas as pd
import pyarrow.parquet as pq
import pytest

from tests.engine.conftest import SMALL_MODEL
from workbench import config as config_module
from workbench.engine import simulation as engine
from workbench.paths import REPO_ROOT
from workbench.run import main

# 2 layers × 2 kv heads × 16 dims × 2 bytes × (K + V) = 256 bytes per slot: 2^-11 GiB = 2048 slots
TINY = ["--model", SMALL_MODEL, "--kv-gib", str(2**-11), "--kernel", "none", "--workload", "alpaca-like",
        "--num-requests", "12", "--rate", "10"]


def status_of(argv: list[str]) -> int:
    """main's exit status, whether returned or raised by the argument parser."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def tree(path) -> dict[str, bytes]:
    """Every file under `path` with its bytes: what 'nothing changed' is checked against."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("argv,message", [
    (["--rate", "inf"], "rate must be a finite number, got inf"),
    (["--rate", "nan"], "rate must be a finite number, got nan"),
    (["--duration=-inf"], "duration must be a finite number, got -inf"),
    (["--step-overhead-s", "inf"], "step_overhead_s must be a finite number, got inf"),
    (["--swap-gib", "nan"], "swap_gib must be a finite number, got nan"),
    (["--kv-gib", "inf"], "kv_gib must be a finite number, got inf"),
    (["--seed", "-1"], "seed must be >= 0, got -1"),
    (["--seed", str(2**64)], f"seed must be <= {2**63 - 1}, got {2**64}"),
    (["--num-requests", str(10**9)], "num_requests must be <= 10000000"),
    (["--eff-bw", "1.5"], "eff_bw must be <= 1, got 1.5"),
    (["--block-size", "4096"], "block_size (4096 tokens) exceeds the KV pool (2048 slots)"),
    (["--max-model-len", "1"], "max_model_len must be >= 2, got 1"),
    (["--max-model-len", "3"], "field 'max_model_len': expected a longer limit: a length limit of 3 tokens fits "
                               "fewer than 1 in 10,000 draws of the alpaca lengths; it needs at least 6 tokens"),
    (["--max-model-len", "12", "--workload", "sharegpt-like"], "it needs at least 26 tokens"),
    (["--kv-slots", str(2**31)], f"kv_slots must be <= {2**31 - 1}"),
    (["--kv-gib", "60000"], "exceeds 2147483647 (int32 slot ids)"),
    (["--kv-gib", "1e9"], "kv_gib must be <= 65536, got 1000000000.0"),
    (["--preemption", "swap", "--swap-gib", "60000"], "more than 2147483647 (int32 slot ids); lower --swap-gib"),
    (["--workload", "fixed:prompt=0"], "field 'prompt': expected an integer in [1, 2147483647]"),
    (["--workload", "azure:/no/such/file.csv"], "field 'path': expected an existing file or a registry trace"),
    (["--seed", "1.5"], "error: argument --seed: invalid int value: '1.5' (see python -m workbench.run --help)"),
])
def test_bad_values_are_one_line_before_any_work(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(engine, "run_in_memory", lambda *a, **k: pytest.fail("the run started"))
    out = tmp_path / "out"
    assert status_of([*TINY, *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []  # nothing written, not even a temporary


def test_a_kernel_pool_larger_than_the_available_memory_is_refused(capsys, monkeypatch):
    monkeypatch.setattr(config_module, "available_memory_bytes", lambda: 2**30)
    # 2 heads × 16 dims × 4 bytes × (K + V) = 256 bytes per slot: 8M slots = 2 GiB > 1 GiB
    argv = [*TINY, "--kernel", "numba", "--kv-dtype", "fp32", "--kv-slots", str(8 * 2**20)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: the KV pool of {8 * 2**20} slots needs 2.02 GiB of host memory (allocator "
                          "arrays 0.0156 GiB, K/V pools (2 kernel heads) 2 GiB, requests 2.86e-06 GiB), but this "
                          "process can allocate 1 GiB "
                          "(the smaller of the machine's available memory and its address-space limit); lower "
                          "--kv-gib/--kv-slots, --kernel-heads, or use --kernel none")
    assert err.count("\n") == 1
    # a fleet holds a pool per replica: one pool of 1M slots (0.25 GiB) fits, five do not
    fleet = [*TINY, "--kernel", "numba", "--kv-dtype", "fp32", "--kv-slots", str(2**20)]
    assert main(fleet) == 0
    capsys.readouterr()
    assert main([*fleet, "--replicas", "5"]) == 2
    assert capsys.readouterr().err.startswith(f"error: 5 KV pools of {2**20} slots need 1.26 GiB of host memory")


def test_an_existing_out_is_refused_and_replaced_only_with_force(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*TINY, "--out", str(out)]) == 0
    first = tree(out)
    assert sorted(first) == ["config.json", "requests.parquet", "steps.parquet", "summary.json"]
    capsys.readouterr()
    assert main([*TINY, "--seed", "5", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --out {out} already holds results; pass --force to replace it\n"
    assert tree(out) == first
    assert main([*TINY, "--seed", "5", "--out", str(out), "--force"]) == 0
    assert json.loads((out / "config.json").read_text())["seed"] == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no temporary or replaced copy left behind


def test_an_empty_out_directory_is_filled(tmp_path):
    out = tmp_path / "made-by-hand"
    out.mkdir()
    assert main([*TINY, "--out", str(out)]) == 0
    assert (out / "summary.json").is_file()


@pytest.mark.parametrize("target", ["new", "forced"])
def test_a_run_failing_while_writing_leaves_nothing_and_the_old_result_whole(tmp_path, monkeypatch, capsys, target):
    """A full disk (OSError from the parquet writer) must neither mix a new config.json into an old run nor
    leave a temporary or half-written directory behind."""
    old = tmp_path / "run"
    assert main([*TINY, "--out", str(old)]) == 0
    before = tree(old)

    def disk_full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", disk_full)  # a fleet's tables, written whole
    monkeypatch.setattr(pq.ParquetWriter, "write_table", disk_full)  # one replica's, streamed in row groups
    out, extra = (tmp_path / "new", []) if target == "new" else (old, ["--force"])
    capsys.readouterr()
    assert main([*TINY, "--seed", "9", "--out", str(out), *extra]) == 1
    assert capsys.readouterr().err == f"error: cannot write {out}: No space left on device; nothing was written\n"
    assert tree(old) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.parametrize("make_bad", [
    lambda tmp: (tmp / "file").write_text("x") and tmp / "file" / "sub",  # a parent that is a file
    lambda tmp: (tmp / "file").write_text("x") and tmp / "file",  # --out itself is a file
])
def test_an_unusable_out_is_found_before_simulating(tmp_path, monkeypatch, capsys, make_bad):
    bad = make_bad(tmp_path)
    monkeypatch.setattr(engine, "run_in_memory", lambda *a, **k: pytest.fail("simulated before checking --out"))
    assert main([*TINY, "--out", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {bad}") and err.count("\n") == 1


def _sigint_by_default() -> None:
    """In the child: SIGINT back to its default, which Python turns into KeyboardInterrupt (a shell starts
    background jobs, `make test &` among them, with SIGINT ignored, and Python keeps an ignored SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_exits_130_with_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "workbench.run", *TINY, "--num-requests", "200000", "--rate", "1000",
                             "--progress", "--out", str(out)], cwd=REPO_ROOT, stderr=subprocess.PIPE,
                            preexec_fn=_sigint_by_default)
    seen = b""
    while b"req" not in seen:  # the progress bar: the run is simulating
        chunk = os.read(proc.stderr.fileno(), 4096)
        assert chunk, f"the run ended before it could be interrupted: {seen!r}"
        seen += chunk
    proc.send_signal(signal.SIGINT)
    err = (seen + proc.stderr.read()).decode()
    proc.wait(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted; nothing was written\n" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_output_cut_off_by_its_reader_ends_quietly():
    proc = subprocess.Popen([sys.executable, "-m", "workbench.run", *TINY], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the table is printed, as with `| head -0`
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert proc.returncode == 128 + signal.SIGPIPE and err == ""
