"""The engine's fast paths give the tables of the plain path, bit for bit, under every strategy.

Fast: decode-only steps skip the admission machinery (`Scheduler._decode_only`), the contiguous strategies
append in one checked pass, `paged` appends, counts
its reserved slots in one compiled call and hands that count to the step's snapshot
(`loops.decode_append`), and `paged-prefix` appends, evicts and registers the blocks it filled in one compiled
call (`prefix.decode_append`), places an admitted prompt (claiming its hits, taking blocks, evicting, filling the
rows, registering its blocks) in one compiled call (`prefix.admit_one_call`) and releases blocks in one
(`prefix.take_release`).
Plain: every step through `Scheduler.schedule`'s general path, every append through the protocol's
`can_append` + `append` (the separate count and apply loops, reserved slots counted by each snapshot), and
every take and release through the index's own calls. Randomized over strategies, pool sizes, fan-out,
preemption, chunked prefill and admission; the strategy's integrity is checked at every step of both runs."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine.conftest import simulate_checked, small_config, summaries_equal
from workbench.allocators import registry
from workbench.allocators.base import Strategy
from workbench.allocators.contiguous.strategy import ContiguousStrategy
from workbench.allocators.paged.strategy import PagedStrategy
from workbench.allocators.prefix import admit_one_call, decode_append, take_release
from workbench.allocators.prefix.hash_index import HashPrefixIndex
from workbench.allocators.prefix.prefix_cache import PrefixCacheStrategy
from workbench.engine.scheduler import Scheduler

CONFIGS = dict(
    strategy=st.sampled_from(registry.names()), block_size=st.sampled_from([1, 3, 8, 16]),
    kv_slots=st.integers(600, 3000), fanout=st.sampled_from([("n", 1), ("n", 2), ("n", 3), ("beam_width", 2)]),
    preemption=st.sampled_from(["recompute", "swap"]), chunked_prefill=st.booleans(),
    admission=st.sampled_from(["fcfs", "skip"]), watermark_frac=st.sampled_from([0.0, 0.05]),
    workload=st.sampled_from(["alpaca-like", "sharegpt-like", "system-prompt:k=3,system=30,lengths=alpaca"]),
    rate=st.sampled_from([3.0, 60.0]), seed=st.integers(0, 2**16))


# The quick run draws one configuration per strategy, the full run 24 more over every axis (the same check
# over more of the space)
@pytest.mark.parametrize("strategy", registry.names())
@settings(max_examples=1, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(**{k: v for k, v in CONFIGS.items() if k != "strategy"})
def test_fast_paths_give_the_plain_tables(monkeypatch, strategy, block_size, kv_slots, fanout, preemption,
                                          chunked_prefill, admission, watermark_frac, workload, rate, seed):
    check_fast_against_plain(monkeypatch, strategy, block_size, kv_slots, fanout, preemption, chunked_prefill,
                             admission, watermark_frac, workload, rate, seed)


@pytest.mark.slow
@settings(max_examples=24, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(**CONFIGS)
def test_more_fast_paths_give_the_plain_tables(monkeypatch, strategy, block_size, kv_slots, fanout, preemption,
                                               chunked_prefill, admission, watermark_frac, workload, rate, seed):
    check_fast_against_plain(monkeypatch, strategy, block_size, kv_slots, fanout, preemption, chunked_prefill,
                             admission, watermark_frac, workload, rate, seed)


def check_fast_against_plain(monkeypatch, strategy, block_size, kv_slots, fanout, preemption, chunked_prefill,
                             admission, watermark_frac, workload, rate, seed):
    cfg = small_config(strategy=strategy, block_size=block_size, kv_slots=kv_slots, preemption=preemption,
                       chunked_prefill=chunked_prefill, admission=admission, watermark_frac=watermark_frac,
                       workload=workload, seed=seed, kernel="none", num_requests=20, rate=rate, swap_gib=1 / 4096,
                       **{fanout[0]: fanout[1]})
    fast = simulate_checked(cfg)
    with monkeypatch.context() as m:
        plain = _plain_run(m, cfg)
    _assert_same_tables(fast, plain)
    assert summaries_equal(fast.summary, plain.summary)


def _plain_run(monkeypatch, cfg, lean_steps: bool = False):
    """`cfg` run with every append through the protocol's `can_append` + `append`, every take and release of a
    prefix cache through its index's calls (no compiled view of the index) and, unless `lean_steps`, every step
    through `schedule`'s general path."""
    if not lean_steps:
        monkeypatch.setattr(Scheduler, "lean_decode_steps", False)
    monkeypatch.setattr(PagedStrategy, "append_if_room", Strategy.append_if_room)
    monkeypatch.setattr(PrefixCacheStrategy, "append_if_room", Strategy.append_if_room)
    monkeypatch.setattr(ContiguousStrategy, "append_if_room", Strategy.append_if_room)
    monkeypatch.setattr(HashPrefixIndex, "one_call_view", lambda self, num_blocks, more_keys: None)
    return simulate_checked(cfg)


def _assert_same_tables(fast, plain) -> None:
    pd.testing.assert_frame_equal(fast.steps, plain.steps, check_exact=True)
    pd.testing.assert_frame_equal(fast.requests, plain.requests, check_exact=True)


def test_decode_only_steps_copy_on_write(monkeypatch):
    """Parallel samples share their prompt's last block: their first decode step, taken by the decode-only
    path while nothing waits, copies it (the case the randomized runs may draw rarely)."""
    cfg = small_config(strategy="paged", block_size=16, kv_slots=4096, n=3, workload="alpaca-like", seed=3,
                       kernel="none", num_requests=12, rate=2.0)
    taken = []
    decode_only = Scheduler._decode_only
    monkeypatch.setattr(Scheduler, "_decode_only", lambda self: taken.append(1) or decode_only(self))
    fast = simulate_checked(cfg)
    assert taken and fast.steps["cow_copies"].sum() > 0
    _assert_same_tables(fast, _plain_run(monkeypatch, cfg))


def test_prefix_cache_appends_in_one_call_under_eviction(monkeypatch):
    """`paged-prefix` in a pool that evicts cached blocks at decode appends: the one-call append runs (and evicts)
    and gives the tables of the protocol's `can_append` + `append`, which take, evict and register step by step."""
    cfg = small_config(strategy="paged-prefix", block_size=4, kv_slots=700, workload="system-prompt:k=3,system=30,"
                       "lengths=alpaca", seed=5, kernel="none", num_requests=40, rate=60.0)
    evicted = []
    one_call = decode_append.append_evicting

    def counted(*args):
        result = one_call(*args)
        evicted.append(result[3])  # blocks this call evicted
        return result

    monkeypatch.setattr(decode_append, "append_evicting", counted)
    fast = simulate_checked(cfg)
    assert sum(evicted) > 0, "no one-call append evicted: the case is not exercised"
    plain = _plain_run(monkeypatch, cfg, lean_steps=True)
    _assert_same_tables(fast, plain)
    assert summaries_equal(fast.summary, plain.summary)


def test_prefix_cache_takes_and_releases_in_one_call_under_eviction(monkeypatch):
    """`paged-prefix` in a pool whose admissions evict cached blocks: the one-call admission (which takes,
    evicting) and the compiled release run, and give the tables of the index's own calls."""
    cfg = small_config(strategy="paged-prefix", block_size=4, kv_slots=700, workload="system-prompt:k=3,system=30,"
                       "lengths=alpaca", seed=5, kernel="none", num_requests=40, rate=60.0)
    calls = {"evicted": 0, "hit": 0, "released": 0, "cached": 0}
    place, release = admit_one_call.place_prompt, take_release.release_to_cache

    def counted_place(rows, hits, fresh, *rest):
        from_free, keys_delta = place(rows, hits, fresh, *rest)
        calls["evicted"] += fresh.shape[0] - from_free
        calls["hit"] += hits.shape[0]
        return from_free, keys_delta

    def counted_release(blocks, registered, *rest):
        calls["released"] += 1
        calls["cached"] += int(registered[blocks].sum())
        return release(blocks, registered, *rest)

    monkeypatch.setattr(admit_one_call, "place_prompt", counted_place)
    monkeypatch.setattr(take_release, "release_to_cache", counted_release)
    fast = simulate_checked(cfg)
    assert all(calls.values()), f"a case is not exercised: {calls}"
    plain = _plain_run(monkeypatch, cfg)
    _assert_same_tables(fast, plain)
    assert summaries_equal(fast.summary, plain.summary)
