"""Every public trace parses completely, with the figures its README states (each test skips, saying how to
fetch it, when its full trace is not here)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from workbench.config import RunConfig
from workbench.workload import build_workload, load_workload
from workbench.workload.describe import prefix_sharing

# registry name -> (workload spec, requests after the default filtering, notes that must appear)
EXPECTED = {
    "azure-llm-2023-conv": ("azure", 19_366, []),
    "azure-llm-2023-code": ("azure", 8_819, []),
    "burstgpt1-head400": ("burstgpt", 383, ["dropped 17 failed rows"]),
    "burstgpt3-head400": ("burstgpt", 399, ["dropped 1 failed rows", "134 sessions"]),
    "mooncake-fast25-conversation": ("mooncake", 8_940, []),
    "alpaca-5000-subset": ("lengths", 4_998, ["dropped 2 failed rows"]),
    "lmsys-apex-lengths": ("lengths", 1_024, []),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parses_completely(real_trace, name):
    path = real_trace(name)
    fmt, count, notes = EXPECTED[name]
    wl = load_workload(RunConfig(workload=f"{fmt}:{name}", max_model_len=1_000_000))
    assert wl.source == str(path)
    assert len(wl.requests) == count
    for note in notes:
        assert any(note in n for n in wl.notes), wl.notes


def test_failed_rows_kept_gives_the_readme_row_count(real_trace):
    for name in ("burstgpt1-head400", "burstgpt3-head400", "alpaca-5000-subset"):
        real_trace(name)
    assert len(build_workload(RunConfig(workload="burstgpt:burstgpt1-head400:failed=keep"))) == 400
    assert len(build_workload(RunConfig(workload="burstgpt:burstgpt3-head400:failed=keep"))) == 400
    assert len(build_workload(RunConfig(workload="lengths:alpaca-5000-subset:failed=keep"))) == 5_000


# Mean prompt and output tokens and the last arrival (s) of each Azure trace, as its README gives them.
AZURE_README = {"azure-llm-2023-conv": (1154.7, 211.1, 3501.7), "azure-llm-2023-code": (2047.8, 27.9, 3435.9)}


@pytest.mark.parametrize("name", sorted(AZURE_README))
def test_azure_readme_stats(real_trace, name):
    real_trace(name)
    requests = build_workload(RunConfig(workload=f"azure:{name}"))
    mean_prompt, mean_output, last_arrival_s = AZURE_README[name]
    assert np.mean([r.prompt_tokens for r in requests]) == pytest.approx(mean_prompt, abs=0.05)
    assert np.mean([r.output_tokens for r in requests]) == pytest.approx(mean_output, abs=0.05)
    assert requests[-1].arrival_s == pytest.approx(last_arrival_s, abs=0.05)


def test_sharegpt_filtered_is_the_vllm_paper_workload(real_trace):
    real_trace("sharegpt-vllm-sosp23-lengths")
    requests = build_workload(RunConfig(workload="lengths:sharegpt-vllm-sosp23-lengths", model="opt-13b"))
    assert len(requests) == 79_731
    assert np.mean([r.prompt_tokens for r in requests]) == pytest.approx(161.31, abs=0.005)
    assert np.mean([r.output_tokens for r in requests]) == pytest.approx(337.99, abs=0.005)
    unfiltered = build_workload(RunConfig(workload="lengths:sharegpt-vllm-sosp23-lengths:filter=none"))
    assert len(unfiltered) == 84_226
    assert np.mean([r.prompt_tokens for r in unfiltered]) == pytest.approx(295.6, abs=0.05)


def test_length_only_files(real_trace):
    real_trace("arxiv-summarization-vidur-lengths")
    real_trace("lmsys-apex-lengths")
    arxiv = build_workload(RunConfig(workload="lengths:arxiv-summarization-vidur-lengths:filter=none"))
    assert len(arxiv) == 28_257
    assert np.mean([r.prompt_tokens for r in arxiv]) == pytest.approx(2588, abs=0.5)
    lmsys = build_workload(RunConfig(workload="lengths:lmsys-apex-lengths"))
    assert np.mean([r.prompt_tokens for r in lmsys]) == pytest.approx(61.7, abs=0.05)


def test_every_mooncake_row_has_ceil_input_over_512_hash_ids(real_trace):
    path = real_trace("mooncake-fast25-conversation")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 8_940
    assert all(len(r["hash_ids"]) == math.ceil(r["input_length"] / 512) for r in rows)
    requests = build_workload(RunConfig(workload=f"mooncake:{path}"))
    assert [r.prompt_tokens for r in requests] == [r["input_length"] for r in rows]
    assert all(len(q.content) == len(r["hash_ids"]) for q, r in zip(requests, rows, strict=True))


def test_mooncake_prefix_sharing_matches_its_readme(real_trace):
    real_trace("mooncake-fast25-conversation")
    requests = build_workload(RunConfig(workload="mooncake:mooncake-fast25-conversation"))
    assert prefix_sharing(requests, 16).hit_frac == pytest.approx(0.361, abs=0.01)


# The upstream FAST25-release/README.md table: requests, mean input and output length (rounded).
MOONCAKE_README = {"mooncake-fast25-conversation-full": (12_031, 12_035, 343),
                   "mooncake-fast25-toolagent": (23_608, 8_596, 182),
                   "mooncake-fast25-synthetic": (3_993, 15_325, 149)}


@pytest.mark.parametrize("name", sorted(MOONCAKE_README))
def test_mooncake_traces_match_the_upstream_readme(real_trace, name):
    real_trace(name)
    requests = build_workload(RunConfig(workload=f"mooncake:{name}", max_model_len=1_000_000))
    count, mean_input, mean_output = MOONCAKE_README[name]
    assert len(requests) == count
    assert round(np.mean([r.prompt_tokens for r in requests])) == mean_input
    assert round(np.mean([r.output_tokens for r in requests])) == mean_output
