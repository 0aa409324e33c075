"""Random operation walks over every registered strategy, its declared options' choices and block sizes.

After every operation: `check_integrity()`, the exact six-way identity (Snapshot refuses to exist
otherwise), the token / reserved / internal split recomputed from slot mappings alone, and every
live sequence reading back its own tokens through the pool (so copies, swaps and prefix hits are
executed and checked, not just counted). When everything is freed, free + cached == capacity.
A prefix cache's host tier (an option with `walk` values) is walked too: its demotes and promotes
are executed on a model host pool, a promoted prefix must read back its tokens, no block a live
sequence holds is ever demoted, and host used + host free == host capacity after every operation.
Half of the admissions are chunked (chunked prefill): the group holds its first chunk and `extend`
brings the rest of its prompt in random chunks, while it is neither appended to, forked nor swapped.
A speculative step (every strategy that `supports_drafts`) writes each sequence's last token and random
drafts, is checked with the drafts held, then keeps a random number of them and rolls the rest back.
A recurrent model's state (docs/recurrent.md) is walked on every strategy that holds one, under every
checkpoint policy: the state classes are exact, every checkpoint ends a prefix some sequence held, and a hit
is the longest cached prefix with a checkpoint where it ends.
"""

from __future__ import annotations

import numpy as np
import pytest
from alloc_model import PoolModel, reference_free_runs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from walk_ops import append_or_refuse, continuation, pool_sizes, shared_prompt, walk_configs

from workbench.allocators import registry
from workbench.allocators.prefix.keys import block_keys
from workbench.allocators.state.book import StateSpec
from workbench.allocators.state.policies import POLICIES


def _quick_configs(reg: registry.Registration) -> list:
    """pytest params of `walk_configs(reg)`. The quick run walks every option combination once and every
    block size at least once (pairing them in turn); the rest of the cross, the same options at other block
    sizes, is marked slow and runs in the full run."""
    configs = walk_configs(reg)
    sizes = list(dict.fromkeys(bs for bs, _ in configs))
    combos = [options for bs, options in configs if bs == sizes[0]]
    quick = {(k % len(sizes), k % len(combos)) for k in range(max(len(sizes), len(combos)))}
    return [pytest.param(reg.name, bs, options, marks=() if (sizes.index(bs), combos.index(options)) in quick
                         else pytest.mark.slow)
            for bs, options in configs]


CONFIGS = [param for reg in registry.registrations() for param in _quick_configs(reg)]


def _state_parts(s) -> tuple[int, int, int, int]:
    """A recurrent state's reference: (state slots, checkpoint slots, the part of those past the state's bytes,
    checkpoint blocks), recounted from the book's blocks; zeros without state."""
    book = getattr(s, "state", None)
    if book is None:
        return 0, 0, 0, 0
    k, slots = book.spec.blocks_per_state, book.spec.state_slots
    assert all(b.shape[0] == k for b in book.live.values())
    assert sorted(book.live) == sorted(s.tables.on_device_rows().tolist())
    states, checkpoints = len(book.live), len(book.checkpoints)
    assert slots <= k * s.block_size
    return states * k * s.block_size, checkpoints * k * s.block_size, 0, checkpoints * k


def _check(model: PoolModel) -> None:
    s = model.s
    s.check_integrity()
    snap = s.snapshot()
    token, reserved, internal = model.reference_partition()
    state, checkpoints, slack, checkpoint_blocks = _state_parts(s)
    assert (snap.state_slots, snap.state_checkpoint_slots) == (state, checkpoints)
    assert (snap.token_slots, snap.reserved_slots, snap.internal_frag_slots) == (token, reserved, internal + slack)
    assert snap.logical_token_slots == sum(len(model.tokens[i]) for i in model.on_device())
    assert snap.token_slots <= snap.logical_token_slots
    assert snap.external_frag_slots == 0  # counted only at a refusal
    assert snap.num_free_blocks * s.block_size == snap.free_slots + snap.cached_slots + checkpoint_blocks * s.block_size
    host = model.host_tier_slots()
    if host is not None:
        used, free, capacity = host
        assert used + free == capacity and used == len(model.tier_used) * s.block_size
    model.verify()


def _check_refusal(model: PoolModel, needed_slots: int) -> None:
    """External fragmentation at a refusal, against the free runs recomputed from the extents."""
    snap = model.s.snapshot(needed_slots)
    if not hasattr(model.s, "fit"):  # no placement of extents (blocks, or pages behind virtual extents)
        assert snap.external_frag_slots == 0 and needed_slots == 0
        return
    assert needed_slots > 0
    assert snap.num_free_blocks == snap.free_slots + snap.external_frag_slots
    if getattr(model.s, "fit", None) != "buddy":  # a buddy pool's free space is not runs of the extents
        runs = reference_free_runs(model)
        assert snap.external_frag_slots == sum(r for r in runs if r < needed_slots)
        assert snap.largest_free_extent_slots == max(runs, default=0)


def _expected_hit(s, prompt: np.ndarray) -> int | None:
    """With a recurrent state and a prefix cache, the tokens an admission of `prompt` must hit: the longest run
    of the index's blocks whose last block's key has a checkpoint (None: not a state prefix cache)."""
    book = getattr(s, "state", None)
    if book is None or s.prefix is None:
        return None
    keys = block_keys(prompt.astype(np.int32), s.block_size)
    kv = s.prefix.lookup(keys, (prompt.shape[0] - 1) // s.block_size).shape[0]
    return max((i for i in range(1, kv + 1) if int(keys[i - 1]) in book.checkpoints), default=0) * s.block_size


def _check_checkpoints(s, histories: list[np.ndarray]) -> None:
    """Every checkpoint sits at a block boundary of some sequence's tokens and is keyed by that prefix."""
    book = getattr(s, "state", None)
    if book is None or not book.checkpoints:
        return
    known = {int(k): (i + 1) * s.block_size for tokens in histories
             for i, k in enumerate(block_keys(tokens.astype(np.int32), s.block_size))}
    registered = set(s.prefix._key_of[s.registered_block_ids()].tolist())  # both indexes keep each block's key
    for key, (_, position, _, _) in book.checkpoints.items():
        assert known.get(key) == position, f"checkpoint {key:#x} at {position} ends no prefix a sequence held"
        assert key in registered, f"checkpoint {key:#x} outlived the block it ends on"


def random_walk(name: str, block_size: int, options: dict, seed: int, num_ops: int = 250,
                state: StateSpec | None = None) -> None:
    """Walk the strategy through random operations, checking every invariant after each one."""
    rng = np.random.default_rng(seed)
    capacity, max_len = pool_sizes(block_size)
    capacity *= STATE_ROOM if state is not None else 1
    s = registry.create(name, capacity_slots=capacity, block_size=block_size, max_model_len=max_len,
                        swap_slots=capacity // 2, state=state, **options)
    histories: list[np.ndarray] = []  # every prompt admitted and every sequence freed (the checkpoints' sources)
    model = PoolModel(s, host_slots=capacity // 2)
    prefixes = [rng.integers(0, 1000, max_len) for _ in range(3)]
    groups: list[list[int]] = []  # admission groups (swap unit), members still live
    pending: dict[int, np.ndarray] = {}  # first id of a group being prefilled -> its prompt tokens still to come
    seen: list[np.ndarray] = []  # token ids of freed sequences, prompt and appended tokens
    next_id = 0
    for _ in range(num_ops):
        op = rng.choice(["admit", "admit", "extend", "append", "append", "append", "speculate", "fork", "free",
                         "swap_out", "swap_in"])
        prefilling = {i for g in groups if g[0] in pending for i in g}
        on_device = [i for i in model.on_device() if i not in prefilling]
        if op == "admit":
            if seen and rng.random() < 0.5:  # continue a sequence seen before (a next turn): hits its decode blocks
                prompt = continuation(rng, seen[int(rng.integers(len(seen)))], max_len - 1)
            else:
                prompt = shared_prompt(rng, prefixes, max_len - 1)
            final = int(rng.integers(prompt.shape[0], max_len + 1))
            n = int(rng.integers(1, 5))
            ids = list(range(next_id, next_id + n))
            before = s.snapshot()
            chunk = int(rng.integers(1, prompt.shape[0] + 1)) if rng.random() < 0.5 else None
            expected = _expected_hit(s, prompt)
            result = model.admit(ids, prompt, final, chunk)
            if result.admitted:
                assert expected is None or result.cached_tokens == expected, "a hit past the last checkpoint"
                histories.append(prompt)
                next_id += n
                groups.append(ids)
                held = len(model.tokens[ids[0]])
                if held < prompt.shape[0]:
                    pending[ids[0]] = prompt[held:]
            else:
                assert s.snapshot() == before, "a refused admission changed the pool"
                _check_refusal(model, result.needed_extent_slots)
        elif op == "extend" and pending:
            group = next(g for g in groups if g[0] in pending)
            rest = pending.pop(group[0])
            k = int(rng.integers(1, rest.shape[0] + 1))
            before = s.snapshot()
            if model.extend(group, rest[:k]).admitted:
                rest = rest[k:]
            else:
                assert s.snapshot() == before, "a refused extend changed the pool"
            if rest.shape[0]:
                pending[group[0]] = rest
        elif op == "append" and on_device:
            batch = [i for i in on_device if len(model.tokens[i]) < model.final[i] and rng.random() < 0.7]
            if not batch:
                continue
            if not append_or_refuse(s, model, batch, rng):
                victim = next(g for g in reversed(groups) if g[0] not in model.swapped)
                if s.supports_swap and victim[0] not in pending and s.can_swap_out(victim):
                    model.swap_out(victim)
                else:  # a group being prefilled is recomputed, never swapped
                    pending.pop(victim[0], None)
                    for i in victim:
                        histories.append(np.array(model.tokens[i]))
                        model.free(i)
                    groups.remove(victim)
        elif op == "speculate" and on_device and s.supports_drafts:
            # speculative decoding: each sequence's last token and drafts up to its final length, all or nothing
            batch = [i for i in on_device if len(model.tokens[i]) < model.final[i] and rng.random() < 0.7]
            if not batch:
                continue
            room = np.array([model.final[i] - len(model.tokens[i]) - 1 for i in batch])
            drafts = np.minimum(rng.integers(0, 6, len(batch)), room)
            before = s.snapshot()
            last = rng.integers(0, 1000, len(batch)).astype(np.int32)
            if model.speculate(batch, last, drafts, rng.integers(0, 1000, int(drafts.sum())).astype(np.int32)):
                _check(model)  # the drafts held, unverified
                model.settle(batch, drafts, np.minimum(rng.integers(0, 6, len(batch)), drafts))
            else:
                assert s.snapshot() == before, "a refused speculative step changed the pool"
        elif op == "fork" and on_device and state is None:  # a recurrent state is not forked
            parent = on_device[int(rng.integers(len(on_device)))]
            if model.fork(parent, next_id).admitted:
                next(g for g in groups if parent in g).append(next_id)
                next_id += 1
        elif op == "free" and model.tokens:
            group = groups[int(rng.integers(len(groups)))]
            rest = pending.pop(group[0], None)
            seq_id = group.pop(int(rng.integers(len(group))))
            if rest is not None and group:  # the other members go on being prefilled
                pending[group[0]] = rest
            seen.append(np.array(model.tokens[seq_id]))
            histories.append(seen[-1])
            model.free(seq_id)
            if not group:
                groups.remove(group)
        elif op == "swap_out" and s.supports_swap:
            device_groups = [g for g in groups if g[0] not in model.swapped and g[0] not in pending]
            if device_groups:
                group = device_groups[int(rng.integers(len(device_groups)))]
                if s.can_swap_out(group):
                    model.swap_out(group)
        elif op == "swap_in" and s.supports_swap:
            host_groups = [g for g in groups if g[0] in model.swapped]
            if host_groups and s.can_swap_in(host_groups[0]):
                model.swap_in(host_groups[0])
        _check(model)
        _check_checkpoints(s, histories + [np.array(t) for t in model.tokens.values()])
    for seq_id in list(model.tokens):
        model.free(seq_id)
        _check(model)
    snap = s.snapshot()
    assert snap.free_slots + snap.cached_slots + snap.state_checkpoint_slots + _state_parts(s)[2] == s.capacity_slots
    assert snap.num_free_blocks * s.block_size == s.capacity_slots


# A recurrent state of 2.5 blocks of 16 (or 40 slots at block 1), under each policy, with a checkpoint budget that
# holds a few states (evictions) or the whole pool
# (quick: block 16, and radix's token-granular tree at block 1 under the small budget; the rest in the full run)
STATE_WALKS = [pytest.param(reg.name, bs, policy, budget,
                            marks=() if bs == 16 or (budget == "few" and reg.prefix_tree) else pytest.mark.slow)
               for reg in registry.registrations() if reg.recurrent_state
               for policy in (POLICIES if reg.prefix_cache else ("none",))
               for bs in (1, 16) for budget in ("few", "pool")]


STATE_ROOM = 4  # a state walk's pool is this many times the others': states and checkpoints take room too


def _state_spec(block_size: int, policy: str, budget: str, capacity: int) -> StateSpec:
    blocks = 40 // block_size if block_size == 1 else 3
    cache_blocks = 3 * blocks if budget == "few" else (capacity // block_size) // blocks * blocks
    return StateSpec(blocks, 40, policy, cache_blocks if policy != "none" else 0, 2.0, 1.0)


@pytest.mark.parametrize("name,block_size,policy,budget", STATE_WALKS)
@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_state_random_walk_keeps_every_invariant(name, block_size, policy, budget, seed):
    capacity = pool_sizes(block_size)[0] * STATE_ROOM
    random_walk(name, block_size, {}, seed, num_ops=200, state=_state_spec(block_size, policy, budget, capacity))


@pytest.mark.parametrize("name", [r.name for r in registry.registrations() if not r.recurrent_state])
def test_a_strategy_without_recurrent_state_refuses_one(name):
    with pytest.raises(ValueError, match="does not hold recurrent state"):
        registry.create(name, capacity_slots=700, block_size=16 if registry.get(name).block_sized else 1,
                        max_model_len=120, state=StateSpec(3, 40))


@pytest.mark.parametrize("name,block_size,options", CONFIGS)
@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_random_walk_keeps_every_invariant(name, block_size, options, seed):
    random_walk(name, block_size, options, seed, num_ops=150)


@pytest.mark.slow
@pytest.mark.parametrize("name,block_size,options", CONFIGS)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_more_random_walks_keep_every_invariant(name, block_size, options, seed):
    random_walk(name, block_size, options, seed, num_ops=400)
