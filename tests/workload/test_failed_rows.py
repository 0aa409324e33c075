"""A trace's failed rows (0 output tokens) are never dropped silently: under the default `failed=drop` the run
says how many on stderr and in its summary (`num_failed_rows_dropped`), for every trace format that drops them;
`failed=keep` replays them and drops none."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workbench as wb
from tests.engine.conftest import SMALL_MODEL


def burstgpt(outputs: list[int]) -> str:
    rows = [f"{i},ChatGPT,40,{out},{40 + out},Conversation log" for i, out in enumerate(outputs)]
    return "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + "\n".join(rows) + "\n"


def azure(outputs: list[int]) -> str:
    rows = [f"2023-11-16 18:15:{i:02d}.0000000,40,{out}" for i, out in enumerate(outputs)]
    return "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n"


FORMATS = {"burstgpt": burstgpt, "azure": azure}
OUTPUTS = st.lists(st.sampled_from([0, 0, 1, 7, 30]), min_size=1, max_size=40).filter(lambda o: any(o))


@pytest.mark.parametrize("kind", FORMATS)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(outputs=OUTPUTS, keep=st.booleans())
def test_failed_rows_are_counted_on_stderr_and_in_the_summary(tmp_path_factory, capsys, kind, outputs, keep):
    path = tmp_path_factory.mktemp("trace") / "trace.csv"
    path.write_text(FORMATS[kind](outputs))
    workload = f"{kind}:{path}" + (":failed=keep" if keep else "")
    result = wb.run(model=SMALL_MODEL, kv_slots=2048, kernel="none", workload=workload)
    dropped = 0 if keep else outputs.count(0)
    err = capsys.readouterr().err
    assert result.metrics["num_failed_rows_dropped"] == dropped
    assert result.metrics["num_requests"] == len(outputs) - dropped
    assert (f"dropped {dropped:,} failed trace rows" in err) == (dropped > 0) and err.count("\n") == (dropped > 0)


def test_the_command_says_it_too(tmp_path, capsys):
    from workbench.run import main

    path = tmp_path / "trace.csv"
    path.write_text(burstgpt([5, 0, 0, 9]))
    assert main(["--model", SMALL_MODEL, "--kv-slots", "2048", "--kernel", "none", "--workload", f"burstgpt:{path}",
                 "--out", str(tmp_path / "out")]) == 0
    assert "dropped 2 failed trace rows" in capsys.readouterr().err
    assert wb.load(tmp_path / "out").metrics["num_failed_rows_dropped"] == 2
