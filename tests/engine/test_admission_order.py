"""Admission order (`--schedule`, workbench.engine.admission_order): hand-worked orders of a waiting queue over
a real prefix index, read without changing it; whole runs under each order keep every request and invariant."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.conftest import checked_strategy, replace, simulate_checked, small_config
from workbench import columns as C
from workbench.allocators import registry
from workbench.allocators.values import NO_MATCH, SeqSpec
from workbench.engine import simulate
from workbench.engine.admission_order import LPM_MAX_WAITING, AdmissionOrder, admission_order, in_batch_deferred
from workbench.engine.groups import Group
from workbench.engine.scheduler_config import SchedulerConfig
from workbench.engine.tokens import TokenStore
from workbench.workload.request import Request, Segment, content_token_ids

BLOCK = 4
R, A, B, C_ = 100, 200, 300, 400  # segment keys: a shared root and three branches


def _config(schedule: str, **changes) -> SchedulerConfig:
    return SchedulerConfig(max_model_len=512, max_num_seqs=64, max_num_batched_tokens=4096, schedule=schedule,
                           **changes)


def _strategy(name: str):
    return registry.create(name, capacity_slots=1024, block_size=BLOCK, max_model_len=512)


def _cache(strategy, *contents: tuple[Segment, ...]) -> None:
    """Mutates. Each prompt is admitted and freed: its full blocks stay cached."""
    for seq_id, content in enumerate(contents, start=1000):
        ids = content_token_ids(content)
        assert strategy.admit([seq_id], SeqSpec(ids, ids.shape[0] + 1)).admitted
        strategy.free(seq_id)


def _groups(*contents: tuple[Segment, ...], outputs: list[int] | None = None) -> list[Group]:
    groups = []
    for i, content in enumerate(contents):
        prompt = sum(s.length for s in content)
        output = 8 if outputs is None else outputs[i]
        groups.append(Group(i, Request(i, 0.01 * i, prompt, output, content), final_len=prompt + output - 1))
    return groups


def _arranged(order: AdmissionOrder, groups: list[Group], step: int = 0) -> list[int]:
    waiting = deque(groups)
    order.arrange(waiting, step)
    assert sorted(g.index for g in waiting) == sorted(g.index for g in groups)
    return [g.index for g in waiting]


def _unchanged_reads(strategy):
    """What a read of the index may not change: its counters, its eviction order, the accounting."""
    return (strategy.counters(), strategy.prefix.evictable_block_ids().tolist(), strategy.snapshot())


def own(i: int, length: int = 8) -> Segment:
    return Segment(1000 + i, length)


@pytest.mark.parametrize("name", ["paged-prefix", "radix"])
def test_lpm_takes_the_longest_cached_prefix_first_ties_by_arrival_and_reads_without_touching(name):
    strategy = _strategy(name)
    _cache(strategy, (Segment(R, 24),))
    # cached: 0, 8, 16, 8, 20 tokens (a hit is whole blocks and leaves the last prompt token to compute)
    groups = _groups((own(0, 24),), (Segment(R, 8), own(1, 16)), (Segment(R, 16), own(2)), (Segment(R, 11), own(3)),
                     (Segment(R, 24),))
    before = _unchanged_reads(strategy)
    assert [strategy.prefix_match(g.request.prompt_token_ids()).tokens for g in groups] == [0, 8, 16, 8, 20]
    order = admission_order(strategy, TokenStore(), _config("lpm"))
    assert _arranged(order, groups) == [4, 2, 1, 3, 0]
    assert _arranged(order, groups[::-1]) == [4, 2, 1, 3, 0]  # the queue's order before does not matter
    assert _unchanged_reads(strategy) == before


def test_lpm_leaves_a_queue_longer_than_sglangs_bound_as_it_stands():
    strategy = _strategy("radix")
    _cache(strategy, (Segment(R, 24),))
    groups = _groups(*[(own(i),) for i in range(LPM_MAX_WAITING)], (Segment(R, 24),))  # the last one hits
    order = admission_order(strategy, TokenStore(), _config("lpm"))
    assert _arranged(order, groups[1:])[0] == LPM_MAX_WAITING  # 128 waiting: sorted
    assert _arranged(order, groups[::-1]) == [g.index for g in groups[::-1]]  # 129 waiting: as they stand


def test_the_in_batch_check_defers_a_request_whose_prefix_one_ahead_of_it_shares():
    # nothing cached: the first of the requests sharing 40 tokens computes them, the second waits behind the rest;
    # one sharing only 31 tokens (below the threshold of 32) is not deferred
    strategy = _strategy("radix")
    groups = _groups((Segment(R, 40), own(0)), (own(1, 48),), (Segment(R, 40), own(2)), (Segment(R, 31), own(3, 17)))
    order = admission_order(strategy, TokenStore(), _config("lpm"))
    assert _arranged(order, groups) == [0, 1, 3, 2]
    assert _arranged(admission_order(strategy, TokenStore(), _config("lpm", in_batch_prefix_tokens=0)),
                     groups) == [0, 1, 2, 3]  # 0: the check is off
    # a threshold of 41 tokens: no request shares that many, none is deferred
    assert _arranged(admission_order(strategy, TokenStore(), _config("lpm", in_batch_prefix_tokens=41)),
                     groups) == [0, 1, 2, 3]
    # once the shared prefix is cached (40 tokens > 32), the check is skipped and the longest match leads
    _cache(strategy, (Segment(R, 40), own(9)))
    assert _arranged(order, groups) == [0, 2, 3, 1]


def test_in_batch_deferral_by_hand():
    p = np.arange(40, dtype=np.int32)
    q = np.arange(100, 140, dtype=np.int32)
    # the second p is deferred; the third p is cached beyond the threshold (not checked); q is new
    assert in_batch_deferred([p, p, p, q, q[:31]], [0, 32, 33, 0, 0], 32) == [False, True, False, False, False]
    assert in_batch_deferred([p, p], [0, 0], 0) == [False, False]


def test_dfs_weight_walks_a_three_branch_tree_heaviest_subtree_first():
    strategy = _strategy("radix")
    # the tree: R (2 blocks) under the root, then branches A, B, C (2 blocks each), created in that order
    _cache(strategy, (Segment(R, 8), Segment(A, 8)), (Segment(R, 8), Segment(B, 8)), (Segment(R, 8), Segment(C_, 8)))
    groups = _groups(
        (Segment(R, 8), Segment(A, 8), own(0)),  # 0: ends at A
        (Segment(R, 8), Segment(B, 8), own(1)),  # 1: B
        (Segment(R, 8), Segment(B, 8), own(2)),  # 2: B
        (Segment(R, 8), Segment(C_, 8), own(3)),  # 3: C
        (Segment(R, 8), Segment(A, 8), own(4)),  # 4: A
        (Segment(R, 8), Segment(B, 8), own(5)),  # 5: B
        (own(6, 24),),  # 6: nothing cached
        (Segment(R, 8), own(7)),  # 7: ends at the end of R
        (Segment(R, 4), own(8, 12)),  # 8: ends halfway down R
        (Segment(R, 8), Segment(C_, 8), own(9)),  # 9: C
    )
    paths = [strategy.prefix_match(g.request.prompt_token_ids()).path for g in groups]
    r, a, b, c = paths[0][0][0], paths[0][1][0], paths[1][1][0], paths[3][1][0]
    assert a < b < c and paths[7] == ((r, 2),) and paths[8] == ((r, 1),) and paths[6] == ()
    before = _unchanged_reads(strategy)
    order = admission_order(strategy, TokenStore(), _config("dfs-weight"))
    # B weighs 3, then A and C 2 each (A was created first); R's own: the deeper end first; the root's last
    assert _arranged(order, groups) == [1, 2, 5, 0, 4, 3, 9, 7, 8, 6]
    assert _unchanged_reads(strategy) == before


def test_lof_takes_the_longest_output_first_ties_by_arrival():
    groups = _groups(*[(own(i),) for i in range(5)], outputs=[10, 50, 5, 50, 20])
    order = admission_order(_strategy("paged"), TokenStore(), _config("lof"))
    assert _arranged(order, groups) == [1, 3, 4, 0, 2]


def test_random_is_a_shuffle_fixed_by_the_seed_and_the_step():
    groups = _groups(*[(own(i),) for i in range(12)])
    tokens = TokenStore()

    def shuffled(seed: int, step: int) -> list[int]:
        return _arranged(admission_order(_strategy("paged"), tokens, _config("random", seed=seed)), groups, step)

    assert shuffled(3, 7) == shuffled(3, 7)
    assert shuffled(3, 7) != list(range(12))
    assert len({tuple(shuffled(3, step)) for step in range(5)}) == 5  # a fresh shuffle each step
    assert shuffled(3, 7) != shuffled(4, 7)


@pytest.mark.parametrize("name", registry.names())
def test_a_strategy_answers_a_match_from_its_own_index_or_neutrally(name):
    reg = registry.get(name)
    strategy = registry.create(name, capacity_slots=1024, block_size=BLOCK if reg.block_sized else 1,
                               max_model_len=512)
    content = (Segment(R, 24),)
    ids = content_token_ids(content)
    assert strategy.admit([0], SeqSpec(ids, 30)).admitted
    strategy.free(0)
    match = strategy.prefix_match(content_token_ids((Segment(R, 16), own(0))))
    if not reg.prefix_cache:
        assert match == NO_MATCH
    else:
        assert match.tokens == 16 and bool(match.path) == reg.prefix_tree
        if match.path:
            assert sum(blocks for _, blocks in match.path) == 16 // BLOCK


def test_fcfs_has_no_order_object():
    assert admission_order(_strategy("radix"), TokenStore(), _config("fcfs")) is None


def _request(i: int, arrival_s: float, content: tuple[Segment, ...], output: int) -> Request:
    return Request(i, arrival_s, sum(s.length for s in content), output, content)


def test_lpm_admits_the_request_that_hits_the_cache_before_an_earlier_one():
    # one request runs at a time: request 0 caches P; requests 1 (new) and 2 (P again) wait behind it. FCFS
    # admits 1 next; lpm admits 2, which finds P cached
    requests = [_request(0, 0.0, (Segment(R, 64),), 40), _request(1, 0.001, (own(1, 64),), 4),
                _request(2, 0.002, (Segment(R, 64), own(2)), 4)]
    cfg = small_config(strategy="radix", kernel="none", max_num_seqs=1, num_requests=3)
    runs = {}
    for schedule in ("fcfs", "lpm"):
        c = replace(cfg, schedule=schedule)
        result = simulate(c, requests, checked_strategy(c))
        assert (result.requests["status"] == "finished").all()
        runs[schedule] = result.requests.set_index("request_id")["admitted_s"]
    assert runs["fcfs"][1] < runs["fcfs"][2]
    assert runs["lpm"][2] < runs["lpm"][1]


ORDERS = [("lpm", "paged-prefix"), ("lpm", "radix"), ("dfs-weight", "radix"), ("lof", "paged"),
          ("random", "contiguous-oracle"), ("random", "radix")]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(order=st.sampled_from(ORDERS), block_size=st.sampled_from([1, 4, 16]), kv_slots=st.integers(512, 2048),
       preemption=st.sampled_from(["recompute", "swap"]), chunked=st.booleans(),
       workload=st.sampled_from(["system-prompt:k=3,system=40,lengths=alpaca",
                                 "multi-turn:turns=3,think=0.2,lengths=alpaca", "alpaca-like"]),
       seed=st.integers(0, 2**16))
def test_a_random_walk_under_any_order_finishes_every_request_with_integrity(order, block_size, kv_slots, preemption,
                                                                           chunked, workload, seed):
    schedule, strategy = order
    cfg = small_config(strategy=strategy, schedule=schedule, block_size=block_size, kv_slots=kv_slots,
                       preemption=preemption, chunked_prefill=chunked, workload=workload, seed=seed, kernel="none",
                       num_requests=20, rate=200.0, swap_gib=1 / 4096)
    result = simulate_checked(cfg)  # check_integrity before every step's snapshot
    steps, requests, summary = result.steps, result.requests, result.summary
    assert (steps[list(C.SLOT_COLUMNS)].sum(axis=1) == summary["kv_slots"]).all()
    assert len(requests) == 20
    assert requests["status"].map(lambda s: s == "finished" or s.startswith("rejected: ")).all()
    assert summary["num_finished"] + summary["num_rejected"] == 20
