"""The compiled loop sizes its arrays by what a run can reach (its requests, its blocks, its workload's
tokens), not by the limits the flags allow: at `--max-num-seqs` and `--max-num-batched-tokens` of 2^31 - 1 it
allocates what a run at the defaults does, and still gives the general loop's tables."""

from __future__ import annotations

import tracemalloc

import pytest

from tests.engine.conftest import small_config
from tests.engine.test_compiled_paged import assert_same, hand_workload, run_both

LIMIT = 2**31 - 1
# a run at the defaults allocates a few MB; one array sized by a limit above would be 16 GiB
ALLOCATED_BYTES_BOUND = 64 << 20


@pytest.mark.parametrize(("max_num_seqs", "max_num_batched_tokens", "burst"),
                         [(LIMIT, None, True), (256, LIMIT, False), (LIMIT, LIMIT, True), (1, LIMIT, True),
                          (LIMIT, 700, False)])
def test_the_loop_allocates_what_a_run_reaches_not_what_a_flag_allows(monkeypatch, max_num_seqs,
                                                                      max_num_batched_tokens, burst):
    cfg = small_config(strategy="paged", kernel="none", kv_slots=3000, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=max_num_batched_tokens)
    requests = hand_workload(7, 60, burst)
    tracemalloc.start()
    try:
        compiled, general = run_both(cfg, requests, monkeypatch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ALLOCATED_BYTES_BOUND
    assert_same(compiled, general)
