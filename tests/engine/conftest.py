"""Shared pieces of the engine tests: a small model geometry and a strategy that checks itself."""

from __future__ import annotations

import dataclasses

import numba
import pytest

from workbench.allocators import registry
from workbench.config import RunConfig
from workbench.engine import RunResult, simulate
from workbench.workload import build_workload

# A layer small enough that every step's kernels and reference checks take milliseconds.
SMALL_MODEL = "custom:layers=2,kv_heads=2,heads=4,head_dim=16,params_b=0.1,max_model_len=512"
# Options sized for that model, set for the strategies that declare them: its K/V rows are 64-128 bytes,
# so 4 KiB physical pages hold 32-64 tokens (a default 2 MiB page would hold more than the whole pool).
SMALL_OPTIONS = {"page_kib": 4}


@pytest.fixture(autouse=True)
def one_numba_thread():
    """Tiny kernels on a shared 2-core machine: thread wake-ups would dominate, so run them serially."""
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(before)


def small_config(**overrides) -> RunConfig:
    base = dict(model=SMALL_MODEL, kv_slots=2048, kernel="numba", kv_dtype="fp32", workload="alpaca-like",
                num_requests=24, rate=40.0, verify_every=1, block_size=8, seed=1)
    taken = registry.get(overrides.get("strategy", RunConfig.strategy)).options
    base.update({option: value for option, value in SMALL_OPTIONS.items() if option in taken})
    base.update(overrides)
    if base["kernel"] == "none":  # nothing to verify without a kernel
        base["verify_every"] = overrides.get("verify_every", 0)
    return RunConfig(**base)


def checked_strategy(cfg: RunConfig, every: int = 1):
    """The configured strategy, wrapped so that every `every`-th snapshot (every step's by default) first
    runs its integrity check. A check walks the whole pool (a radix tree at block 1: every token), so
    long runs at small blocks sample it."""
    strategy = registry.create_from_config(cfg, cfg.resolve())
    base = type(strategy)
    calls = [0]

    class Checked(base):
        def snapshot(self, refused_extent_slots: int = 0):
            if calls[0] % every == 0:
                self.check_integrity()
            calls[0] += 1
            return super().snapshot(refused_extent_slots)

    strategy.__class__ = Checked
    return strategy


def simulate_checked(cfg: RunConfig, every: int = 1) -> RunResult:
    """Simulate with the strategy's integrity checked at every `every`-th snapshot, and once at the end."""
    strategy = checked_strategy(cfg, every)
    result = simulate(cfg, build_workload(cfg), strategy)
    strategy.check_integrity()
    return result


def replace(cfg: RunConfig, **changes) -> RunConfig:
    return dataclasses.replace(cfg, **changes)


def summaries_equal(a: dict, b: dict) -> bool:
    """Summaries equal key by key, NaN equal to NaN (a run without finished requests has NaN figures), the
    wall time left out."""
    keys = set(a) - {"sim_wall_s"}
    return keys == set(b) - {"sim_wall_s"} and all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in keys)
