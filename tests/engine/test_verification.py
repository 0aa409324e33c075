"""Verification can fail: planted allocator bugs in test doubles of real strategies are caught."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.engine.conftest import small_config
from workbench.allocators.paged.strategy import PagedStrategy
from workbench.allocators.values import AppendResult
from workbench.config import RunConfig
from workbench.engine import simulate
from workbench.engine.runner import VerificationError
from workbench.workload import build_workload


def _strategy(cls, cfg: RunConfig):
    res = cfg.resolve()
    return cls(capacity_slots=res.capacity_slots, block_size=cfg.block_size, max_model_len=res.model.max_model_len,
               swap_slots=res.swap_slots)


class SkipsCopyOnWrite(PagedStrategy):
    """Returns no copy-on-write pairs: a sample's copied block keeps stale (unwritten) rows."""

    def append(self, seq_ids):
        result = super().append(seq_ids)
        return AppendResult(result.slots, np.zeros((0, 2), dtype=np.int32))


class SwapsTwoBlocks(PagedStrategy):
    """Describes the first sequence with two of its blocks exchanged in the kernel's page table."""

    def describe(self, seq_ids):
        desc = super().describe(seq_ids)
        lo, hi = int(desc.kv_indptr[0]), int(desc.kv_indptr[1])
        if hi - lo >= 2:
            indices = desc.kv_indices.copy()
            indices[lo], indices[lo + 1] = indices[lo + 1], indices[lo]
            desc = dataclasses.replace(desc, kv_indices=indices)
        return desc


@pytest.mark.parametrize("cls,workload,n", [(SkipsCopyOnWrite, "fixed:prompt=21,output=30", 4),
                                            (SwapsTwoBlocks, "fixed:prompt=40,output=10", 1)])
def test_planted_bug_fails_verification_naming_request_and_step(cls, workload, n):
    cfg = small_config(strategy="paged", workload=workload, n=n, num_requests=4)
    with pytest.raises(VerificationError, match=r"step \d+: request \d+ \(sequence \d+\) \w+ attention differs"):
        simulate(cfg, build_workload(cfg), _strategy(cls, cfg))


def test_the_honest_strategy_passes_the_same_runs():
    for workload, n in (("fixed:prompt=21,output=30", 4), ("fixed:prompt=40,output=10", 1)):
        cfg = small_config(strategy="paged", workload=workload, n=n, num_requests=4)
        summary = simulate(cfg, build_workload(cfg), _strategy(PagedStrategy, cfg)).summary
        assert summary["verify_max_rel_err"] <= 1e-5
