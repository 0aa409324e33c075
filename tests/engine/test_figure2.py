"""The vLLM paper's Figure 2 setting: OPT-13B, 12 GiB of KV, ShareGPT lengths, a saturating load."""

from __future__ import annotations

import pytest

from workbench.config import RunConfig
from workbench.engine import run
from workbench.traces import locate

STRATEGIES = ("contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged")


@pytest.fixture(scope="module")
def summaries():
    path = locate("sharegpt-vllm-sosp23-lengths")
    if path is None:
        pytest.skip("needs the full trace sharegpt-vllm-sosp23-lengths: "
                    "python -m workbench.traces fetch sharegpt-vllm-sosp23-lengths")
    out = {}
    for strategy in STRATEGIES:
        # lengths traces are filtered to prompt+output <= max_model_len (2048), as the paper's scripts did
        cfg = RunConfig(strategy=strategy, block_size=16, model="opt-13b", kv_gib=12, workload=f"lengths:{path}",
                        rate=50.0, num_requests=300, kernel="none", seed=0)
        out[strategy] = run(cfg)
    return out


def test_token_share_rises_strictly_from_max_to_pow2_to_oracle_to_paged(summaries):
    shares = [summaries[s]["mem_token_frac_sat"] for s in STRATEGIES]
    assert all(a < b for a, b in zip(shares, shares[1:], strict=False)), dict(zip(STRATEGIES, shares, strict=True))
    assert shares[-1] > 0.9  # paged keeps nearly all of the pool in live tokens under saturation


def test_contiguous_max_never_batches_more_than_seven(summaries):
    # 15,728 slots / 2,048 reserved per request = 7 requests at most
    assert summaries["contiguous-max"]["kv_slots"] == 15_728
    assert summaries["contiguous-max"]["max_batch_size"] <= 7


def test_every_request_ends_finished(summaries):
    for s in summaries.values():
        assert s["num_finished"] == 300 and s["num_rejected"] == 0
