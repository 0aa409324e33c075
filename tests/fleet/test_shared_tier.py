"""The fleet's shared tier (`--shared-tier-gib`, `--shared-link-gb-s`): a scripted demote by one replica and a
hit by another with the block ids and bytes worked by hand, the cascade from a replica's own host tier,
random walks of two replicas over one pool with every invariant checked after each operation, a kernel-
verified fleet, the clock charge, the host-memory count and the options' checks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.allocators.alloc_model import PoolModel
from tests.engine.conftest import checked_strategy, replace, small_config
from tests.engine.golden import numerics_problems, outputs_of
from workbench.allocators import registry
from workbench.allocators.prefix.shared_tier import SharedTier
from workbench.allocators.values import SeqSpec
from workbench.allocators.virtual.pages import KVGeometry
from workbench.clock.roofline import RooflineClock
from workbench.clock.step_cost import StepCost
from workbench.config import RunConfig, host_memory_bytes
from workbench.engine.kvpool import KVPool
from workbench.engine.runner import VerificationError
from workbench.engine.simulation import simulate_fleet
from workbench.engine.summary_counters import summary_counters
from workbench.presets import GIB, GPUS, model_from_name
from workbench.workload import build_workload

SHARED_TIERED = [r.name for r in registry.registrations() if "shared_tier_gib" in r.options]
# one layer whose K (or V) row is 2^28 bytes: a block of 2 tokens is 2 × 2^28 × 2 bytes = 1 GiB
GIB_PER_BLOCK = KVGeometry(num_layers=1, buffer_bytes_per_token=2**28)


def _replica(name: str, tier: SharedTier, host_blocks: int = 0):
    """A replica's strategy: 4 device blocks of 2 tokens, `host_blocks` host-tier blocks, the fleet's `tier`."""
    return registry.create(name, capacity_slots=8, block_size=2, max_model_len=8, geometry=GIB_PER_BLOCK,
                           host_cache_gib=float(host_blocks), shared_tier=tier)


def _admit(s, seq_id: int, prompt: list[int]) -> int:
    result = s.admit([seq_id], SeqSpec(np.array(prompt, dtype=np.int32), len(prompt)))
    assert result.admitted
    return result.cached_tokens


def test_every_prefix_cache_takes_a_shared_tier():
    assert SHARED_TIERED and set(SHARED_TIERED) == {r.name for r in registry.registrations() if r.prefix_cache}


@pytest.mark.parametrize("name", SHARED_TIERED)
def test_one_replica_demotes_and_another_hits_with_exact_blocks_and_bytes(name):
    """Replica 0 serves A = [1 2 3 4 5]; B evicts A's two full blocks into the shared pool; replica 1, which
    never saw A, then takes them from the pool for C = [1 2 3 4 7], and so does replica 0: a copy, not a move."""
    tier = SharedTier(3)
    r0, r1 = _replica(name, tier), _replica(name, tier)
    assert r0.shared_tier is r1.shared_tier is tier and r0.shared_tier_blocks == 3
    assert _admit(r0, 0, [1, 2, 3, 4, 5]) == 0  # blocks 0 [1 2], 1 [3 4] registered; 2 holds [5]
    r0.free(0)  # 0 and 1 cached (1, the tail, to go first); 2 back on the free stack
    assert r0.end_step().shared_demote.shape == (0, 2)
    assert _admit(r0, 1, [9] * 7) == 0  # 4 blocks: free 2 and 3, then evicts 1 and 0
    effects = r0.end_step()
    # (device, shared): A's [3 4] into shared block 0, [1 2] into shared block 1; no host tier to spill from
    assert effects.shared_demote.tolist() == [[1, 0], [0, 1]]
    assert effects.shared_spill.tolist() == effects.shared_promote.tolist() == []
    assert dict(effects.columns) == {"shared_token_slots": 4, "shared_free_slots": 2}
    # replica 1: no device hit, both blocks in the shared tier (at most (5 - 1) // 2 = 2 may hit)
    assert r1.cached_prompt_tokens(np.array([1, 2, 3, 4, 7], dtype=np.int32)) == 4
    assert _admit(r1, 0, [1, 2, 3, 4, 7]) == 4
    effects = r1.end_step()
    assert effects.shared_promote.tolist() == [[1, 0], [0, 1]]  # (shared, device): [1 2] into 0, [3 4] into 1
    assert effects.shared_demote.tolist() == []
    assert dict(effects.columns) == {"shared_token_slots": 4, "shared_free_slots": 2}  # the entries stay
    assert (r1.prefix_hit_tokens, r1.prefix_hit_tokens_shared) == (0, 4)
    block_bytes = 2**30  # GIB_PER_BLOCK
    totals = summary_counters(r1.counters(), block_bytes)
    assert (totals["prefix_hit_tokens_shared"], totals["shared_bytes_loaded"], totals["shared_bytes_demoted"]) == \
        (4, 2 * block_bytes, 0)
    totals = summary_counters(r0.counters(), block_bytes)
    assert (totals["shared_bytes_loaded"], totals["shared_bytes_demoted"]) == (0, 2 * block_bytes)
    # replica 0, whose device evicted A's blocks, hits A's prefix in the pool as well
    r0.free(1)
    assert _admit(r0, 2, [1, 2, 3, 4, 8]) == 4 and r0.prefix_hit_tokens_shared == 4
    assert r0.end_step().shared_promote.shape == (2, 2) and tier.num_used() >= 2
    for s in (r0, r1):
        s.check_integrity()
    # the promoted blocks are device blocks of replica 1 again: the same prefix now hits on its device
    assert _admit(r1, 1, [1, 2, 3, 4, 6]) == 4 and r1.prefix_hit_tokens == 4
    assert r1.end_step().shared_promote.tolist() == []


@pytest.mark.parametrize("name", SHARED_TIERED)
def test_the_host_tier_spills_its_dropped_entries_into_the_shared_tier(name):
    """One host-tier block: the first evicted block goes there; the next eviction, a step later, spills it into
    the shared tier (host -> shared) and takes its host block; later evictions of that step find the host
    block written already and go straight to the shared tier (device -> shared)."""
    tier = SharedTier(4)
    s = _replica(name, tier, host_blocks=1)
    _admit(s, 0, [1, 2, 3, 4, 5])  # blocks 0 [1 2], 1 [3 4]; 2 holds [5]
    s.free(0)  # 0 and 1 cached (1 first), 2 free
    s.end_step()
    _admit(s, 1, [7, 7, 7, 7, 7])  # 3 blocks: free 2 and 3, then evicts 1 ([3 4]) into the host block
    effects = s.end_step()
    assert effects.demote.tolist() == [[1, 0]] and effects.shared_demote.tolist() == []
    s.free(1)  # 2 [7 7] and 3 [7 7] cached after 0 [1 2] (least recently used first), 1 ([7]) free
    assert s.cached_block_ids().tolist() == [0, 3, 2]
    _admit(s, 2, [8, 8, 8, 8, 8, 8, 8])  # 4 blocks: free 1, then evicts 0, 3 and 2
    effects = s.end_step()
    # 0 ([1 2]) takes the host block: its entry [3 4], demoted a step before, is spilled into shared block 0
    # first; 3 and 2 find the host block written this step and go from the device to shared blocks 1 and 2
    assert effects.shared_spill.tolist() == [[0, 0]]
    assert effects.demote.tolist() == [[0, 0]]
    assert effects.shared_demote.tolist() == [[3, 1], [2, 2]]
    assert s.counters()["shared_blocks_demoted"] == 3 and tier.num_used() == 3
    s.check_integrity()
    s.free(2)
    # [1 2] and [3 4] are back from the host tier and the shared tier: the walk goes device -> host -> shared
    assert s.cached_prompt_tokens(np.array([1, 2, 3, 4, 9], dtype=np.int32)) == 4


def _walk(name: str, host_blocks: int, seed: int, num_ops: int = 200) -> None:
    """Two replicas over one shared pool: random admissions (often repeating a few shared prefixes or an earlier
    sequence), appends and frees on a random replica; every move of each operation (one step) executed on
    model pools (token ids), and after each: both strategies' integrity, the pool's used + free == capacity and
    one block per key, every live sequence reading back its tokens."""
    rng = np.random.default_rng(seed)
    bs, capacity, max_len = 4, 160, 60
    tier = SharedTier(12)
    shared = np.full(tier.num_blocks * bs, -1, dtype=np.int64)
    mib_per_block = KVGeometry(num_layers=1, buffer_bytes_per_token=2**20 // (2 * bs))  # K and V of bs tokens
    strategies = [registry.create(name, capacity_slots=capacity, block_size=bs, max_model_len=max_len,
                                  host_cache_gib=host_blocks * 2**-10, shared_tier=tier, geometry=mib_per_block)
                  for _ in range(2)]
    assert strategies[0].host_tier_blocks == host_blocks
    models = [PoolModel(s, shared=shared) for s in strategies]
    prefixes = [rng.integers(0, 1000, max_len) for _ in range(3)]
    seen: list[np.ndarray] = []
    next_id = 0
    hits = 0
    for _ in range(num_ops):
        k = int(rng.integers(2))
        model, s = models[k], strategies[k]
        op = rng.choice(["admit", "admit", "append", "free"])
        live = model.on_device()
        if op == "admit":
            if seen and rng.random() < 0.5:  # a next turn of an earlier sequence, on either replica
                prompt = seen[int(rng.integers(len(seen)))][:max_len - 1]
            else:
                length = int(rng.integers(1, max_len))
                cut = int(rng.integers(0, length + 1))
                prompt = np.concatenate([prefixes[int(rng.integers(3))][:cut], rng.integers(0, 1000, length - cut)])
            final = int(rng.integers(prompt.shape[0], max_len + 1))
            before = s.prefix_hit_tokens_shared
            if model.admit([next_id], prompt, final).admitted:
                next_id += 1
            hits += s.prefix_hit_tokens_shared - before
        elif op == "append" and live:
            batch = [i for i in live if len(model.tokens[i]) < model.final[i]]
            if batch and s.can_append(batch):
                model.append(batch, rng)
        elif op == "free" and live:
            seq_id = live[int(rng.integers(len(live)))]
            seen.append(np.array(model.tokens[seq_id]))
            model.free(seq_id)
        model._host_moves(model._held_blocks())  # a step with no moves: the pool's columns as they stand now
        for m in models:
            m.s.check_integrity()
            m.verify()
        row = dict(model.effects.columns)
        assert row["shared_token_slots"] + row["shared_free_slots"] == tier.num_blocks * bs
        assert row["shared_token_slots"] == tier.num_used() * bs
        keys = list(tier._block_of_key)
        assert len(set(tier._block_of_key.values())) == len(keys)  # one block per key, one key per block
    assert hits > 0, "the walk never hit the shared tier"


@pytest.mark.parametrize("name", SHARED_TIERED)
@pytest.mark.parametrize("host_blocks", [0, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_walks_of_two_replicas_keep_every_invariant(name, host_blocks, seed):
    _walk(name, host_blocks, seed)


def _fleet(cfg: RunConfig, replicas: int):
    res = cfg.resolve()
    tier = registry.create_shared_tier(cfg, res)
    strategies = [registry.create_from_config(cfg, res, tier) for _ in range(replicas)]
    checked = checked_strategy(cfg)  # the integrity-checking wrapper class, applied to each replica
    for s in strategies:
        s.__class__ = type(checked)
    result = simulate_fleet(cfg, build_workload(cfg), strategies)
    for s in strategies:
        s.check_integrity()
    return result, strategies


# four tenants' 160-token system prompts do not all fit beside the running requests in 512 slots: evicted
# blocks go to the shared pool and come back on any replica (SMALL_MODEL in fp32 is 512 bytes per token:
# 2^-10 GiB holds 2,048 tokens)
TENANTS = dict(workload="system-prompt:k=4,system=160,lengths=alpaca", num_requests=20, kv_slots=512, rate=8.0,
               router="round-robin")
SHARED_GIB = 2**-10


@pytest.fixture(scope="module", params=SHARED_TIERED)
def fleet_runs(request):
    base = small_config(strategy=request.param, **TENANTS)
    return _fleet(base, 2)[0], _fleet(replace(base, shared_tier_gib=SHARED_GIB), 2)[0]


def test_a_kernel_verified_fleet_promotes_from_the_shared_tier(fleet_runs):
    """Every step verified (numba, decode and extend against the float64 reference): blocks one replica demoted
    and another promoted hold the right KV. A shared hit replaces a recompute: device hits stay as they were."""
    off, on = fleet_runs
    s_off, s_on = off.summary, on.summary
    assert s_on["num_finished"] == s_off["num_finished"] == 20
    assert not numerics_problems(outputs_of(on))
    assert s_on["prefix_hit_rate_shared"] > 0.05 and s_off["prefix_hit_rate_shared"] == 0
    block_bytes = model_from_name(small_config().model).kv_bytes_per_token("fp32") * 8
    assert s_on["shared_bytes_loaded"] % block_bytes == 0
    assert s_on["shared_bytes_loaded"] / block_bytes * 8 == pytest.approx(
        s_on["prefix_hit_rate_shared"] * s_on["prefix_query_tokens"])
    assert s_on["shared_bytes_demoted"] >= block_bytes and s_off["shared_bytes_demoted"] == 0
    per = s_on["per_replica"]
    for key in ("shared_bytes_loaded", "shared_bytes_demoted"):
        assert s_on[key] == sum(p[key] for p in per)
    assert on.requests["prefix_hit_tokens"].sum() > off.requests["prefix_hit_tokens"].sum()


def test_a_kernel_verified_fleet_spills_its_host_tiers_into_the_shared_tier(monkeypatch):
    """With a small host tier per replica, its drops are copied host -> shared on the real arrays, and hits come
    from both tiers, every step verified."""
    spilled = [0]
    spill = KVPool.spill_shared

    def counting(self, moves, block_size):
        spilled[0] += len(moves)
        spill(self, moves, block_size)

    monkeypatch.setattr(KVPool, "spill_shared", counting)
    cfg = small_config(strategy=SHARED_TIERED[0], shared_tier_gib=SHARED_GIB, host_cache_gib=2**-14,
                       **{**TENANTS, "num_requests": 30})
    result, _ = _fleet(cfg, 2)
    summary = result.summary
    assert spilled[0] > 0 and summary["num_finished"] == 30
    assert summary["prefix_hit_rate_host"] > 0 and summary["prefix_hit_rate_shared"] > 0
    assert not numerics_problems(outputs_of(result))


def test_shared_columns_are_the_fleet_pool_and_appear_only_with_it(fleet_runs):
    off, on = fleet_runs
    assert "shared_token_slots" not in off.steps
    capacity = int(SHARED_GIB * GIB) // 512
    assert ((on.steps["shared_token_slots"] + on.steps["shared_free_slots"]) == capacity).all()
    assert on.steps["shared_token_slots"].max() > 0


def test_a_corrupted_shared_copy_fails_verification(monkeypatch):
    """The check has teeth: perturb what a demote writes into the shared tier, and a request whose prefix is
    promoted from it differs from the reference."""
    demote = KVPool.demote_shared

    def corrupting(self, moves, block_size):
        demote(self, moves, block_size)
        rows = (moves[:, 1:2].astype(np.int64) * block_size + np.arange(block_size)).ravel()
        self.shared_k[rows] += 0.25

    monkeypatch.setattr(KVPool, "demote_shared", corrupting)
    with pytest.raises(VerificationError, match="differs from the reference"):
        _fleet(small_config(strategy=SHARED_TIERED[0], shared_tier_gib=SHARED_GIB, **TENANTS), 2)


def test_one_array_serves_every_replica():
    cfg = small_config(strategy=SHARED_TIERED[0], shared_tier_gib=SHARED_GIB, **{**TENANTS, "num_requests": 2})
    from workbench.engine.simulation import make_replica, shared_kv_of

    res = cfg.resolve()
    tier = registry.create_shared_tier(cfg, res)
    strategies = [registry.create_from_config(cfg, res, tier) for _ in range(2)]
    shared_kv = shared_kv_of(cfg, res, strategies[0], "numba")
    pools = [make_replica(cfg, res, s, [], "numba", shared_kv=shared_kv).runner.pool for s in strategies]
    assert pools[0].shared_k is pools[1].shared_k and pools[0].shared_v is pools[1].shared_v
    assert pools[0].shared_k.shape[0] == tier.num_blocks * cfg.block_size


def test_replicas_with_different_shared_tiers_are_refused():
    cfg = small_config(strategy=SHARED_TIERED[0], shared_tier_gib=SHARED_GIB, kernel="none", **TENANTS)
    strategies = [registry.create_from_config(cfg, cfg.resolve()) for _ in range(2)]  # each builds its own
    with pytest.raises(ValueError, match="different shared tiers"):
        simulate_fleet(cfg, build_workload(cfg), strategies)


def test_same_config_gives_identical_results():
    from workbench.engine.simulation import run

    cfg = small_config(strategy=SHARED_TIERED[0], shared_tier_gib=SHARED_GIB, kernel="none", replicas=3,
                       **TENANTS)
    a, b = run(cfg), run(cfg)
    exact = [json.dumps({k: v for k, v in summary.items() if k != "sim_wall_s"}, sort_keys=True) for summary in (a, b)]
    assert exact[0] == exact[1]  # NaN figures (no saturated step) compare as text
    assert a["shared_bytes_loaded"] > 0


def test_a_fleet_of_one_uses_the_shared_tier_as_a_slower_host_tier():
    from workbench.engine.simulation import run

    cfg = small_config(strategy=SHARED_TIERED[0], shared_tier_gib=SHARED_GIB, kernel="none", **TENANTS)
    summary = run(cfg)
    assert summary["prefix_hit_rate_shared"] > 0 and "replicas" not in summary


def test_a_shared_promote_costs_its_bytes_over_the_shared_link_added_or_overlapped():
    model = model_from_name("llama-3-8b")
    kv_bytes_per_token, block_size, loaded, link_gb_s = model.kv_bytes_per_token("fp16"), 16, 100, 25.0
    shared_s = loaded * kv_bytes_per_token * block_size / (link_gb_s * 1e9)
    host_s = loaded * kv_bytes_per_token * block_size / (25.0 * 1e9)  # a100: 32 GB/s × 25/32

    def clock(overlap_load: bool) -> RooflineClock:
        return RooflineClock(model, GPUS["a100-40gb"], kv_bytes_per_token, block_size, eff_bw=0.8, eff_flops=0.75,
                             step_overhead_s=1e-3, overlap_load=overlap_load, shared_link_gb_s=link_gb_s)

    work = StepCost(num_prefill_tokens=512, num_decode_tokens=8, kv_read_tokens=9000, attn_query_ctx=200_000,
                    decode_ctx_tokens=8000, unshared_block_slots=0, num_running=9, copied_blocks=0, swapped_blocks=0)
    step_s = clock(False).cost_s(work)
    shared = work._replace(shared_loaded_blocks=loaded)
    assert clock(False).cost_s(shared) == pytest.approx(step_s + shared_s, rel=1e-12)
    assert clock(True).cost_s(shared) == pytest.approx(max(step_s, shared_s), rel=1e-12)
    both = shared._replace(loaded_blocks=loaded)  # the two loads one after the other
    assert clock(False).cost_s(both) == pytest.approx(step_s + shared_s + host_s, rel=1e-12)
    many = work._replace(shared_loaded_blocks=100 * loaded)
    assert clock(True).cost_s(many) == pytest.approx(100 * shared_s, rel=1e-12) and 100 * shared_s > step_s


def test_the_host_memory_check_counts_the_shared_tier_once():
    base = small_config(strategy=SHARED_TIERED[0], replicas=4)
    res = base.resolve()
    row_bytes = res.kernel_heads * res.model.head_dim * 4  # fp32
    shared_slots = int(SHARED_GIB * GIB // res.kv_bytes_per_token)
    with_tier = replace(base, shared_tier_gib=SHARED_GIB)
    assert host_memory_bytes(with_tier, res) - host_memory_bytes(base, res) == 2 * shared_slots * row_bytes
    no_kernel = replace(base, kernel="none", verify_every=0)
    assert host_memory_bytes(replace(no_kernel, shared_tier_gib=SHARED_GIB), res) == host_memory_bytes(no_kernel, res)


def test_strategies_without_a_prefix_cache_reject_the_shared_tier_options():
    for reg in registry.registrations():
        if reg.name in SHARED_TIERED:
            registry.check_options(RunConfig(strategy=reg.name, shared_tier_gib=1.0, shared_link_gb_s=10.0))
            continue
        for option in ({"shared_tier_gib": 1.0}, {"shared_link_gb_s": 10.0}):
            with pytest.raises(ValueError, match="does not apply to strategy"):
                registry.check_options(RunConfig(strategy=reg.name, **option))
    for bad in ({"shared_tier_gib": -1.0}, {"shared_link_gb_s": 0.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RunConfig(**bad)
    with pytest.raises(ValueError, match="shared_tier_gib = 1e-06 holds no KV block"):
        registry.create_shared_tier(RunConfig(strategy="paged-prefix", shared_tier_gib=1e-6),
                                    RunConfig(strategy="paged-prefix").resolve())


def test_a_sweep_takes_the_shared_tier_as_axes():
    from workbench.sweep import parse_spec

    spec = parse_spec({"base": {"strategy": "paged-prefix", "replicas": 2, "kernel": "none"},
                       "axes": {"shared_tier_gib": [0, 0.5], "shared_link_gb_s": [12.5, 25]}})
    points = spec.points()
    assert sorted((p.config.shared_tier_gib, p.config.shared_link_gb_s) for p in points) == \
        [(0.0, 12.5), (0.0, 25.0), (0.5, 12.5), (0.5, 25.0)]


def test_a_shared_tier_on_a_hybrid_pool_is_refused():
    """Like the host tier, the shared tier serves the one-table prefix cache: one line says so."""
    for name in (n for n in SHARED_TIERED if n in registry.hybrid_names()):
        with pytest.raises(ValueError, match="--shared-tier-gib 1.0 with --hybrid on"):
            registry.check_options(RunConfig(strategy=name, model="gpt-oss-20b", shared_tier_gib=1.0))
