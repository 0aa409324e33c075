"""`python -m workbench.run`: flags from RunConfig, a summary table, one-line errors with exit 2."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from tests.engine.conftest import SMALL_MODEL
from workbench import columns as C
from workbench.config import RunConfig
from workbench.run import build_parser, main


def test_every_config_field_is_a_flag_with_help():
    help_text = build_parser().format_help()
    for f in dataclasses.fields(RunConfig):
        assert "--" + f.name.replace("_", "-") in help_text
    for unit in ("GiB", "tokens", "requests/s", "seconds"):
        assert unit in help_text


@pytest.mark.parametrize("argv,message", [
    (["--strategy", "nope"], "unknown strategy 'nope'; valid: contiguous-max, contiguous-pow2, contiguous-oracle, "
                             "paged, paged-prefix"),
    (["--block-size", "0"], "block_size must be > 0, got 0"),
    (["--kv-slots", "-5"], "kv_slots must be > 0, got -5"),
    (["--kv-slots", "1000"], "cannot hold a single request of max_model_len = 2048 tokens"),
    (["--n", "2", "--beam-width", "3"], "contradictory"),
    (["--max-num-batched-tokens", "512"], "max_num_batched_tokens (512) < max_model_len (2048)"),
    (["--workload", "nonsense-name", "--kernel", "none"], "nonsense-name"),
    (["--batching", "static", "--chunked-prefill"], "batching static prefills each batch whole when it starts: "
                                                    "contradictory with chunked_prefill"),
    (["--batching", "static", "--prefill-replicas", "1", "--decode-replicas", "1"],
     "batching static with prefill_replicas/decode_replicas is not built"),
    (["--schedule", "lpm"], "--schedule lpm orders by the strategy's own prefix index: strategy 'paged' has none; "
                            "strategies with one: paged-prefix, radix"),
    (["--schedule", "dfs-weight", "--strategy", "paged-prefix"], "strategy 'paged-prefix' has none; strategies with "
                                                                 "one: radix"),
    (["--schedule", "lof", "--in-batch-prefix-tokens", "8"], "applies to --schedule lpm only"),
])
def test_bad_configs_exit_2_with_one_line(argv, message, capsys, tmp_path):
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not out.exists()  # nothing half written


def test_an_unknown_batching_exits_2_with_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:  # argparse's choices: before any work
        main(["--batching", "dynamic", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "argument --batching: invalid choice: 'dynamic'" in err
    assert err.count("\n") == 1 and not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="^batching: 'dynamic' is not one of continuous, static$"):  # a sweep's key
        RunConfig(batching="dynamic")


def test_an_unknown_schedule_exits_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--schedule", "sjf"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "invalid choice: 'sjf'" in err and "lpm" in err and err.count("\n") == 1


def test_a_run_prints_the_summary_and_writes_the_files(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["--model", SMALL_MODEL, "--kv-slots", "2048", "--kernel", "none", "--workload", "alpaca-like",
               "--num-requests", "20", "--rate", "10", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "requests finished / rejected" in printed and "20 / 0" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert tuple(summary) == C.SUMMARY_KEYS and summary["num_finished"] == 20


def test_module_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "workbench.run", "--strategy", "bogus"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "unknown strategy 'bogus'" in proc.stderr


@pytest.mark.parametrize("argv,message", [
    (["--kernel", "none", "--verify-every", "1"], "verify_every > 0 needs a kernel"),
    (["--kernel", "none", "--clock", "measured"], "clock measured times the kernel"),
    (["--n", "8", "--max-num-seqs", "4"], "a request of 8 sequences can never run with max_num_seqs = 4"),
])
def test_contradictory_flags_exit_2(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_run_whose_queue_stays_empty_says_so(capsys):
    argv = ["--model", SMALL_MODEL, "--kv-slots", "8192", "--kernel", "none", "--workload", "alpaca-like",
            "--num-requests", "10"]
    assert main([*argv, "--rate", "0.05"]) == 0
    assert "note: requests queued in only 0% of steps" in capsys.readouterr().out
    assert main([*argv, "--rate", "10000", "--max-num-seqs", "2"]) == 0
    assert "note:" not in capsys.readouterr().out


def test_help_lists_every_strategy_model_and_gpu_name():
    from workbench.allocators import registry
    from workbench.presets import GPUS, MODELS

    text = " ".join(build_parser().format_help().split()).replace("- ", "-")  # undo argparse's line wrapping
    for name in [*registry.names(), *MODELS, *GPUS]:
        assert name in text, name
