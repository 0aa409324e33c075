"""Every registered strategy serving DeepSeek-V2-Lite's latent KV with the latent decode kernel verified at
every step, and sparse attention's top-k fed to the sparse kernel (docs/kernels.md): the replica a run builds
(`make_replica`) holds one latent row per slot and a runner with the model's `LatentKernel`.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.engine.conftest import SMALL_OPTIONS
from workbench.allocators import registry
from workbench.config import RunConfig
from workbench.engine import simulation
from workbench.engine.latent import top_k_positions
from workbench.table_sink import MemorySink
from workbench.workload.build import build_workload

SPARSE_MODEL = ("custom:layers=2,heads=4,head_dim=32,kv_lora=512,rope_dim=64,index_heads=2,index_dim=128,"
                "index_topk=24,params_b=0.05,max_model_len=512")


def _latent_replica(cfg: RunConfig):
    res = cfg.resolve()
    replica = simulation.make_replica(cfg, res, registry.create_from_config(cfg, res), build_workload(cfg), "numba")
    assert replica.runner.pool.k.shape[1:] == (1, res.kernel_head_dim)  # one latent row per slot
    return replica


def _serve(cfg: RunConfig):
    replica = _latent_replica(cfg)
    sink = MemorySink()
    try:
        simulation._drive(replica, False, sink)
    finally:
        replica.close()
    sink.close()
    return replica.runner, sink.frame("requests")


def _config(strategy: str, **overrides) -> RunConfig:
    base = dict(model="deepseek-v2-lite", kv_slots=4096, max_model_len=512, kernel="numba", kv_dtype="bf16",
                workload="alpaca-like", num_requests=10, rate=40.0, verify_every=1, block_size=16, seed=3,
                strategy=strategy)
    base.update({k: v for k, v in SMALL_OPTIONS.items() if k in registry.get(strategy).options})
    base.update(overrides)
    return RunConfig(**base)


@pytest.mark.parametrize("strategy", registry.names())
def test_every_strategy_serves_a_latent_model_with_the_kernel_verified(strategy):
    cfg = _config(strategy)
    runner, requests = _serve(cfg)
    assert (requests["status"] == "finished").all() and len(requests) == cfg.num_requests
    assert runner.latent is not None and runner.kernel_bytes > 0
    assert runner.kernel_bytes % ((512 + 64) * 2) == 0  # whole latent rows, read once for all 16 heads
    assert 0 <= runner.verify_max_rel_err <= 1e-2


@pytest.mark.parametrize("block_size", [16, 64])
def test_sparse_attention_reads_the_top_k_through_the_page_table(block_size):
    cfg = _config("paged", model=SPARSE_MODEL, kv_dtype="fp32", block_size=block_size, workload="sharegpt-like",
                  num_requests=6)
    runner, requests = _serve(cfg)
    assert (requests["status"] == "finished").all()
    assert 0 <= runner.verify_max_rel_err <= 1e-5
    longest = int((requests["prompt_tokens"] + requests["output_tokens"]).max())
    assert longest > 24  # some queries attended a top-k subset of their context


def test_top_k_is_deterministic_and_covers_short_contexts():
    ids, lens = np.array([3, 9]), np.array([10, 100])
    first = top_k_positions(ids, lens, 24, step=5, seed=1)
    again = top_k_positions(ids, lens, 24, step=5, seed=1)
    other = top_k_positions(ids, lens, 24, step=6, seed=1)
    assert all((a == b).all() for a, b in zip(first, again, strict=True))
    assert first[0].tolist() == [0, 10, 34]
    assert first[1][:10].tolist() == list(range(10))  # a context shorter than k attends to every position
    chosen = first[1][10:]
    assert len(set(chosen.tolist())) == 24 and chosen.max() < 100 and (np.diff(chosen) > 0).all()
    assert (other[1][10:] != chosen).any()  # another step draws other positions
