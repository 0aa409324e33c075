"""The clock's attention totals with sliding-window layers (`step_cost`): a window layer counts
min(context, W) keys, checked against a brute-force sum over the decoding sequences and prefill queries."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.clock.step_cost import CostMeter
from workbench.config import RunConfig
from workbench.engine import simulation as engine
from workbench.engine.groups import Group
from workbench.engine.plan import Prefill


def _brute(kv_lens: list[int], prefills: list[tuple[int, int, int]], windows, full_frac: float):
    """(decode ctx, kv read, attn ctx) averaged over layers: `kv_lens` of the decoding sequences after this
    step's token, `prefills` (num_seqs, start, stop)."""
    def layer(cap):
        c = (lambda x: x) if cap is None else (lambda x: min(x, cap))
        decode = sum(c(k) for k in kv_lens)
        read = decode + sum(n * len(range(max(0, s - (cap or s + 1) + 1), e)) for n, s, e in prefills)
        attn = decode + sum(c(q + 1) for _, s, e in prefills for q in range(s, e))
        return np.array([decode, read, attn], dtype=float)
    return full_frac * layer(None) + sum(frac * layer(w) for w, frac in windows)


@pytest.mark.parametrize("seed", range(4))
def test_window_totals_match_a_brute_force_sum(seed):
    rng = np.random.default_rng(seed)
    windows = ((7, 0.25), (32, 0.5))
    meter = CostMeter(16, windows)
    running: list[Group] = []
    for step in range(120):
        if running and rng.random() < 0.15:  # a group leaves (finished or preempted), synced at this step
            g = running.pop(int(rng.integers(len(running))))
            meter.add(g.kv_len, g.num_seqs, step, -1)
        if rng.random() < 0.3:  # a group joins with some context (a prompt, or one swapped back in)
            g = Group(step, None, 10_000, seq_ids=list(range(int(rng.integers(1, 3)))),
                      kv_len=int(rng.integers(1, 60)))
            meter.add(g.kv_len, g.num_seqs, step, +1)
            running.append(g)
        if running:
            meter.decoded(sum(g.num_seqs for g in running), step)
            for g in running:
                g.kv_len += 1
        prefills = []
        for _ in range(int(rng.integers(0, 3))):
            start = int(rng.integers(0, 50))
            seq_ids = tuple(range(int(rng.integers(1, 3))))
            prefills.append(Prefill(-1, seq_ids, 0, start, 0, start, start + int(rng.integers(1, 50)), True))
        cost = meter.cost(sum(g.num_seqs for g in running), prefills, [], 0, 0)
        kv_lens = [g.kv_len for g in running for _ in g.seq_ids]
        expected = _brute(kv_lens, [(p.num_seqs, p.start, p.stop) for p in prefills], windows, 0.25)
        assert np.allclose([cost.decode_ctx_tokens, cost.kv_read_tokens, cost.attn_query_ctx], expected,
                           rtol=1e-12, atol=1e-9)


def test_without_windows_the_totals_stay_integers():
    g = Group(0, None, 100, seq_ids=[0], kv_len=40)
    meter = CostMeter(16)
    meter.add(g.kv_len, g.num_seqs, 0, +1)
    meter.decoded(1, 0)
    cost = meter.cost(1, [Prefill(1, (1,), 30, 0, 30, 0, 30, True)], [], 0, 0)
    assert (cost.decode_ctx_tokens, cost.kv_read_tokens, cost.attn_query_ctx) == (41, 71, 41 + 465)
    assert all(type(v) is int for v in (cost.decode_ctx_tokens, cost.kv_read_tokens, cost.attn_query_ctx))


def test_window_layers_make_long_context_steps_faster_under_the_roofline():
    """gpt-oss-20b: half its layers read at most 128 keys, so long decodes cost less KV traffic than a
    model of full layers would; the allocation (`--hybrid`) does not change the charge."""
    base = dict(strategy="paged", model="gpt-oss-20b", max_model_len=4096, kernel="none", kv_slots=40_000,
                workload="fixed:prompt=2000,output=300", num_requests=8, rate=1000.0, seed=1)
    on = engine.run(RunConfig(**base))
    off = engine.run(RunConfig(**{**base, "hybrid": "off"}))
    full = engine.run(RunConfig(**{**base, "model": "custom:layers=24,kv_heads=8,heads=64,head_dim=64,"
                                                    "params_b=20.9,max_model_len=4096"}))
    assert on["sim_time_s"] == off["sim_time_s"] < full["sim_time_s"]
