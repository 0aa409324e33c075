"""A run that can serve no request of its workload is refused before it starts, fuzzed (hypothesis): traces and
synthetic lengths against max_model_len, parallel samples and beams against a strategy's limits, pools against
requests. Whatever the mix, `python -m workbench.run` either writes a summary in which at least one request
finished and every figure is what a summary holds (no NaN where a number belongs), or refuses in one line,
exit 2, naming the request it tried and why, with nothing written."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import call_cli
from tests.engine.conftest import SMALL_MODEL
from workbench.allocators import registry
from workbench.results import summary_problem
from workbench.run import main

UNSERVABLE_EXAMPLES = 40
AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
REFUSAL = "no request of the workload can be served with this configuration: the shortest, request "


def azure_trace(folder: Path, lengths: list[tuple[int, int]]) -> str:
    rows = [f"2023-11-16 18:15:{10 + i:02d}.0000000,{p},{o}\n" for i, (p, o) in enumerate(lengths)]
    path = folder / "trace.csv"
    path.write_text(AZ + "".join(rows))
    return f"azure:{path}"


def run(argv: list[str]) -> tuple[int, str]:
    return call_cli(main, argv)


@settings(max_examples=UNSERVABLE_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.tuples(st.integers(1, 700), st.integers(1, 300)), min_size=1, max_size=5),
       trace=st.booleans(), max_model_len=st.sampled_from([16, 64, 256, 512]),
       strategy=st.sampled_from(registry.names()), fanout=st.sampled_from([("n", 1), ("n", 3), ("beam-width", 2)]),
       max_batch=st.sampled_from([1, 2, 256]), kv_slots=st.sampled_from([512, 2048]))
def test_a_run_serves_a_request_or_is_refused_before_it_starts(lengths, trace, max_model_len, strategy, fanout,
                                                               max_batch, kv_slots):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        workload = azure_trace(root, lengths) if trace else f"fixed:prompt={lengths[0][0]},output={lengths[0][1]}"
        argv = ["--model", SMALL_MODEL, "--kernel", "none", "--workload", workload, "--num-requests", "5",
                "--kv-slots", str(kv_slots), "--max-model-len", str(max_model_len), "--strategy", strategy,
                f"--{fanout[0]}", str(fanout[1]), "--out", str(root / "out")]
        if "max_batch" in registry.get(strategy).options:
            argv += ["--max-batch", str(max_batch), "--page-kib", "4"]
        status, err = run(argv)
        event(f"exit {status}" + (" (unservable)" if REFUSAL in err else ""))
        assert "Traceback" not in err
        if status == 2:
            assert err.startswith("error: ") and err.count("\n") == 1, err
            assert not (root / "out").exists() and sorted(p.name for p in root.iterdir()) == ["trace.csv"] * trace
            return
        assert status == 0, err
        summary = json.loads((root / "out" / "summary.json").read_text())
        assert summary["num_finished"] >= 1 and summary_problem(summary) is None, summary


def test_a_trace_no_request_of_which_fits_max_model_len_is_refused(tmp_path, capsys):
    workload = azure_trace(tmp_path, [(300, 50), (200, 90)])
    assert main(["--model", SMALL_MODEL, "--kernel", "none", "--workload", workload, "--max-model-len", "256",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {REFUSAL}1 (200 prompt + 90 output tokens), is refused alone in an empty KV pool: " \
                  "prompt+output (290) > max_model_len (256)\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fanout", [["--n", "4"], ["--beam-width", "4"]])
def test_more_samples_than_virtual_extents_is_refused_naming_max_batch(tmp_path, capsys, fanout):
    assert main(["--model", SMALL_MODEL, "--kernel", "none", "--workload", "fixed:prompt=8,output=8",
                 "--num-requests", "4", "--strategy", "virtual-contiguous", "--page-kib", "4", "--max-batch", "2",
                 *fanout, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {REFUSAL}0 (8 prompt + 8 output tokens × 4 ") and err.endswith(
        "is refused alone in an empty KV pool: its 4 sequences need 4 virtual extents, more than --max-batch 2\n")
    assert list(tmp_path.iterdir()) == []
