"""Chunked prefill (`--chunked-prefill`): every strategy with the verified Numba kernel, exact chunk
sizes per step, the token budget and the §3 accounting at every step, recompute-only preemption of a
partial prefill, and the latency trade it makes."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import strategy_workload_grid
from tests.engine.conftest import checked_strategy, small_config
from tests.engine.test_engine_strategies import check_run
from workbench.allocators import registry
from workbench.config import RunConfig
from workbench.engine import simulate
from workbench.engine.groups import GroupState
from workbench.engine.residency import Residency
from workbench.workload import build_workload
from workbench.workload.request import Request, Segment

BUDGET = 40  # tokens per step: shorter than most ShareGPT-like prompts, so they are chunked
WORKLOADS = {
    "chat-tight": dict(workload="sharegpt-like", num_requests=16, rate=20.0, kv_slots=1024, kv_dtype="fp32"),
    "chat-swap": dict(workload="sharegpt-like", num_requests=16, rate=20.0, kv_slots=1024, kv_dtype="fp16",
                      preemption="swap", swap_gib=0.0005),
    "parallel-n4": dict(workload="alpaca-like", n=4, kv_dtype="fp16"),
    "beam3": dict(workload="alpaca-like", beam_width=3, num_requests=6, kv_dtype="fp32"),
    "system-prompt": dict(workload="system-prompt:k=2,system=40,lengths=alpaca", kv_dtype="bf16"),
}


def chunked_config(**overrides) -> RunConfig:
    return small_config(chunked_prefill=True, max_num_batched_tokens=BUDGET, max_num_seqs=16, **overrides)


def _request(request_id: int, arrival_s: float, prompt: int, output: int) -> Request:
    return Request(request_id, arrival_s, prompt, output, (Segment(1000 + request_id, prompt),))


@pytest.mark.parametrize(("strategy", "workload"), strategy_workload_grid(registry.names(), sorted(WORKLOADS),
                                                                         per_strategy=1))
def test_every_strategy_prefills_in_chunks_with_verified_kernels(strategy, workload):
    cfg = chunked_config(strategy=strategy, **WORKLOADS[workload])
    requests = build_workload(cfg)
    result = simulate(cfg, requests, checked_strategy(cfg))
    check_run(result, cfg)  # the §3 partition at every step, every request finished, kernels verified
    steps = result.steps
    assert (steps["num_prefill_tokens"] + steps["num_decode_tokens"] <= BUDGET).all()
    if any(r.prompt_tokens > BUDGET for r in requests):  # some prompt needed several steps
        assert (steps["num_prefill_tokens"] == BUDGET - steps["num_decode_tokens"]).any()


# Budget 64. D (10-token prompt, 6 tokens out), then A and B (100-token prompts, 3 tokens out), all at t = 0.
SCRIPT_REQUESTS = [_request(0, 0.0, 10, 6), _request(1, 0.0, 100, 3), _request(2, 0.0, 100, 3)]
SCRIPT = [  # per step, written by hand: prefill tokens, decode tokens, token slots held after allocation
    (10 + 54, 0, 10 + 54),  # D whole; A's first chunk fills the budget
    (46 + 17, 1, 11 + 100 + 17),  # D decodes; A's last chunk (first token); B's first chunk
    (62, 2, 12 + 101 + 79),  # D and A decode; B's second chunk takes the rest of the budget
    (21, 2, 13 + 102 + 100),  # B's last chunk; A produces its third and last token
    (0, 2, 14 + 101),  # A freed
    (0, 2, 15 + 102),  # D and B finish
]


@pytest.mark.parametrize("strategy", registry.names())
def test_chunk_sizes_per_step_follow_the_budget_exactly(strategy):
    cfg = small_config(strategy=strategy, chunked_prefill=True, max_num_batched_tokens=64, max_num_seqs=16,
                       model="custom:layers=2,kv_heads=2,heads=4,head_dim=16,params_b=0.1,max_model_len=128",
                       num_requests=3)
    result = simulate(cfg, SCRIPT_REQUESTS, checked_strategy(cfg))
    steps, requests = result.steps, result.requests
    got = list(zip(steps["num_prefill_tokens"], steps["num_decode_tokens"], steps["token_slots"], strict=True))
    assert got == SCRIPT
    t_end = steps["t_s"].to_numpy()
    # first tokens come with the last chunk: D after step 0, A after step 1, B after step 3
    assert requests["first_token_s"].tolist() == [t_end[0], t_end[1], t_end[3]]
    assert requests["admitted_s"].tolist() == [0.0, 0.0, t_end[0]]
    assert requests["finish_s"].tolist() == [t_end[5], t_end[3], t_end[5]]
    assert 0 <= result.summary["verify_max_rel_err"] <= 1e-5


def _record_preemptions(monkeypatch) -> list[tuple[GroupState, GroupState]]:
    """(state before, state after) of every group the scheduler preempts."""
    seen = []
    preempt = Residency.preempt

    def recorded(self, g, swap_out, step):
        before = g.state
        preempt(self, g, swap_out, step)
        seen.append((before, g.state))
    monkeypatch.setattr(Residency, "preempt", recorded)
    return seen


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
@pytest.mark.parametrize("strategy", [r.name for r in registry.registrations() if r.kernel_mode == "paged"])
def test_a_partial_prefill_is_preempted_by_recompute(strategy, preemption, monkeypatch):
    """A decodes and grows while B's long prompt is prefilled in chunks; the pool cannot hold both, so
    B, the latest arrival, is preempted part-way — by recompute even when swapping is on."""
    seen = _record_preemptions(monkeypatch)
    cfg = small_config(strategy=strategy, chunked_prefill=True, max_num_batched_tokens=40, max_num_seqs=16,
                       model="custom:layers=2,kv_heads=2,heads=4,head_dim=16,params_b=0.1,max_model_len=320",
                       kv_slots=384, num_requests=2, preemption=preemption, swap_gib=0.001)
    requests = [_request(0, 0.0, 150, 160), _request(1, 0.01, 300, 4)]
    result = simulate(cfg, requests, checked_strategy(cfg))
    check_run(result, cfg)
    assert (GroupState.PREFILLING, GroupState.WAITING) in seen
    assert all(after == GroupState.WAITING for before, after in seen if before == GroupState.PREFILLING)
    assert result.requests["num_preemptions"].tolist()[0] == 0 and result.requests["num_preemptions"].tolist()[1] > 0
    assert result.steps["swapped_blocks"].sum() == 0


@pytest.mark.parametrize("strategy", [r.name for r in registry.registrations() if r.kernel_mode == "paged"])
def test_a_partial_prefill_continues_in_a_step_that_preempted(strategy):
    """Under `lof` the short prompt G (200 tokens out) is admitted before A (300-token prompt, 4 out), whose
    prompt is then prefilled in 39-token chunks beside G's decodes. A's last 36 tokens do not fit, so A waits
    while G grows into the rest of the pool; when G cannot grow, G, the latest arrival, is preempted and the
    batch is empty. A is running: its last chunk is computed in that same step, as vLLM schedules a running
    request's chunk after a preemption (a step with nothing computing and nothing rejected means stuck). The
    blocks A holds while it waits count in each step's unshared slots."""
    cfg = small_config(strategy=strategy, chunked_prefill=True, max_num_batched_tokens=40, max_num_seqs=16,
                       schedule="lof", kv_slots=312, num_requests=2,
                       model="custom:layers=2,kv_heads=2,heads=4,head_dim=16,params_b=0.1,max_model_len=312")
    result = simulate(cfg, [_request(0, 0.0, 300, 4), _request(1, 0.0, 10, 200)], checked_strategy(cfg))
    check_run(result, cfg)
    steps = result.steps
    preempted = steps[steps["preemptions"] > 0]
    assert preempted[["preemptions", "num_prefill_tokens", "num_decode_tokens"]].values.tolist() == [[1, 36, 0]]
    assert result.requests["num_preemptions"].tolist() == [0, 1]
    # while A waits for room it computes nothing and holds its first 264 tokens' blocks: nothing is shared, so
    # the unshared count is what is allocated at every step, those steps included
    waiting = steps.index[(steps["num_prefill_tokens"] == 0) & (steps["num_decode_tokens"] == 1)
                          & (steps["token_slots"] > 264)]
    assert len(waiting) > 20
    allocated = steps["token_slots"] + steps["reserved_slots"] + steps["internal_frag_slots"]
    assert (steps["unshared_block_slots"] == allocated).all()


@pytest.mark.parametrize("strategy", registry.names())
def test_chunking_delays_a_long_prompt_and_smooths_the_decodes(strategy):
    """Eight sequences decode when a 3000-token prompt arrives. Unchunked, one step computes the whole
    prompt and every decoder waits for it; chunked, six steps each carry the decodes and a 512-token
    chunk: the prompt's first token comes later (each step re-reads the weights and pays the
    overhead) and the longest gap between two tokens of a decoder shrinks, as does their spread."""
    requests = [_request(i, 0.0, 16, 400) for i in range(8)] + [_request(8, 1.0, 3000, 20)]
    out = {}
    for chunked in (False, True):
        cfg = RunConfig(strategy=strategy, model="llama-3-8b", gpu="a100-80gb", kernel="none", seed=0,
                        chunked_prefill=chunked, max_num_batched_tokens=512 if chunked else None)
        result = simulate(cfg, requests, registry.create_from_config(cfg, cfg.resolve()))
        steps = result.steps
        decode_dt = steps.loc[steps["num_decode_tokens"] > 0, "dt_s"].to_numpy()
        ttft = result.requests["first_token_s"].to_numpy() - result.requests["arrival_s"].to_numpy()
        out[chunked] = (ttft[8], decode_dt.max(), np.std(decode_dt))
    (ttft_off, gap_off, spread_off), (ttft_on, gap_on, spread_on) = out[False], out[True]
    assert ttft_on > ttft_off
    assert gap_on < gap_off / 2
    assert spread_on < spread_off


def test_the_flag_is_a_switch_and_the_budget_must_cover_the_decodes():
    from workbench.run import build_parser
    assert build_parser().parse_args(["--chunked-prefill"]).chunked_prefill is True
    assert build_parser().parse_args([]).chunked_prefill is False
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(128\) < max_num_seqs \(256\)"):
        RunConfig(chunked_prefill=True, max_num_batched_tokens=128).resolve()
    assert RunConfig(chunked_prefill=True, max_num_batched_tokens=512).resolve().max_num_batched_tokens == 512
    with pytest.raises(ValueError, match="without --chunked-prefill"):  # whole prompts need the whole length
        RunConfig(max_num_batched_tokens=512).resolve()
