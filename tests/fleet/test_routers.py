"""Each router's choices, worked out by hand on scripted replica states."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from workbench.config import ROUTER_NAMES
from workbench.fleet.cache_aware import BALANCE_ABS, PromptTree
from workbench.fleet.registry import ROUTERS, make_router
from workbench.workload.request import Request, Segment

BLOCK = 4


@dataclass
class View:
    """A scripted replica: its load, held blocks, cached prompt tokens, prompt tokens a request queued there
    shares and queued prefill tokens."""

    load: int = 0
    blocks: int = 0
    cached: int = 0
    queued: int = 0
    inflight: int = 0

    def outstanding(self) -> int:
        return self.load

    def active_blocks(self) -> int:
        return self.blocks

    def cached_prompt_tokens(self, token_ids: np.ndarray) -> int:
        return self.cached

    def inflight_prompt_tokens(self, prompt_keys: list[int]) -> int:
        return self.inflight

    def queued_prefill_tokens(self) -> int:
        return self.queued


def request(rid: int, *segments: tuple[int, int], session: str | None = None) -> Request:
    content = tuple(Segment(key, length) for key, length in segments)
    return Request(rid, float(rid), sum(n for _, n in segments), 4, content, session_id=session)


def router(name: str, n: int, seed: int = 0):
    return make_router(name, n, block_size=BLOCK, seed=seed)


def test_every_router_name_has_a_router():
    assert tuple(ROUTERS) == ROUTER_NAMES
    with pytest.raises(ValueError, match="unknown router 'nearest'"):
        make_router("nearest", 2, block_size=BLOCK, seed=0)


def test_round_robin_takes_the_replicas_in_turn():
    r, views = router("round-robin", 3), [View(load=9), View(), View()]
    assert [r.choose(request(i, (1, 8)), views) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_loaded_takes_the_fewest_outstanding_the_lowest_index_on_a_tie():
    r = router("least-loaded", 3)
    assert r.choose(request(0, (1, 8)), [View(load=3), View(load=1), View(load=1)]) == 1
    assert r.choose(request(1, (1, 8)), [View(load=0), View(load=1), View(load=0)]) == 0


def test_power_of_two_takes_the_less_loaded_of_two_draws():
    r = router("power-of-two", 2)  # two replicas: both are always drawn
    assert all(r.choose(request(i, (1, 8)), [View(load=5), View(load=2)]) == 1 for i in range(20))
    draws = [router("power-of-two", 8, seed=3).choose(request(0, (1, 8)), [View(load=k) for k in range(8)])
             for _ in range(3)]
    assert len(set(draws)) == 1  # seeded: the same draws every time
    spread = router("power-of-two", 8, seed=3)
    picks = [spread.choose(request(i, (1, 8)), [View()] * 8) for i in range(400)]
    assert set(picks) == set(range(8))  # with equal loads every replica gets requests
    never = router("power-of-two", 8, seed=3)  # the most loaded replica is never the less loaded of two
    assert 7 not in [never.choose(request(i, (1, 8)), [View(load=k) for k in range(8)]) for i in range(200)]


def test_session_keeps_a_conversation_on_one_replica_and_moves_few_when_one_is_added():
    r4, r5 = router("session", 4), router("session", 5)
    views4, views5 = [View()] * 4, [View()] * 5
    sessions = [f"conv-{i}" for i in range(400)]
    first = [r4.choose(request(i, (1, 8), session=s), views4) for i, s in enumerate(sessions)]
    again = [r4.choose(request(i, (1, 8), session=s), views4) for i, s in enumerate(sessions)]
    assert first == again and set(first) == {0, 1, 2, 3}
    moved = [a != b for a, b in zip(first, (r5.choose(request(i, (1, 8), session=s), views5)
                                             for i, s in enumerate(sessions)), strict=True)]
    assert 0.05 < np.mean(moved) < 0.35  # consistent hashing: about 1/5 of the sessions move, not 4/5
    plain = router("session", 3)  # without a session id: round robin
    assert [plain.choose(request(i, (1, 8)), [View()] * 3) for i in range(4)] == [0, 1, 2, 0]


def test_cache_aware_follows_the_longest_match_then_the_smallest_tree_and_balances_load():
    r, views = router("cache-aware", 3), [View(), View(), View()]
    a = request(0, (7, 16))  # 4 blocks
    assert r.choose(a, views) == 0  # no match anywhere: the smallest tree (all empty: the lowest index)
    assert r.choose(request(1, (7, 16), (8, 4)), views) == 0  # 16 of 20 tokens matched on 0 (> 30%)
    assert r.choose(request(2, (9, 16)), views) == 1  # no match: replica 1 and 2 have the smallest trees
    assert r.choose(request(3, (7, 4), (10, 12)), views) == 2  # 4 of 16 tokens = 25% <= 30%: smallest tree
    assert r.choose(request(4, (7, 8), (11, 8)), views) == 0  # 8 of 16 = 50% on replica 0 (2 on replica 2)
    loaded = [View(load=BALANCE_ABS + 1), View(load=0), View(load=3)]
    assert r.choose(request(5, (7, 16)), loaded) == 1  # imbalanced: max - min > 64 and max > 1.5 min
    assert r.trees[1].matched_blocks(_keys(request(5, (7, 16)))) == 4  # a load-routed prompt enters its tree
    # not beyond 64: request 4's prompt again, whole on replica 0, half on replica 1
    assert r.choose(request(6, (7, 8), (11, 8)), [View(load=BALANCE_ABS), View(), View()]) == 0


def _keys(req: Request) -> list[int]:
    from workbench.allocators.prefix.keys import block_keys
    return block_keys(req.prompt_token_ids(), BLOCK).tolist()


def test_a_prompt_tree_trims_its_least_recent_leaves_first():
    tree = PromptTree(BLOCK, max_tokens=4 * BLOCK)
    old, new = _keys(request(0, (1, 12))), _keys(request(1, (2, 8)))
    tree.insert(old)
    tree.insert(new)  # 5 blocks > 4: the old prompt's leaf goes, its first two blocks stay
    assert len(tree) == 4 and tree.matched_blocks(old) == 2 and tree.matched_blocks(new) == 2


def test_kv_exact_weighs_blocks_to_prefill_against_blocks_held():
    r = router("kv-exact", 2)
    prompt = request(0, (1, 16))  # 4 blocks
    # cost = (queued + prompt - cached tokens) / 4 + held blocks + prompt blocks not cached
    # replica 0, 3 blocks cached, 10 held: 1 + (10 + 1) = 12; replica 1, nothing cached, 5 held: 4 + 9 = 13
    assert r.choose(prompt, [View(blocks=10, cached=12), View(blocks=5)]) == 0
    assert r.choose(prompt, [View(blocks=10, cached=12), View(blocks=3)]) == 1  # 12 > 4 + 7
    assert r.choose(prompt, [View(blocks=10, cached=12, queued=8), View(blocks=5)]) == 1  # 3 + 11 > 13
    assert r.choose(prompt, [View(blocks=10, cached=12, load=4), View(blocks=4, load=1)]) == 1  # 12 = 12: load
    heavy = make_router("kv-exact", 2, block_size=BLOCK, seed=0, overlap_weight=4.0)  # 4 + 11 < 16 + 3
    assert heavy.choose(prompt, [View(blocks=10, cached=12), View(blocks=3)]) == 0


def test_kv_exact_counts_a_prefix_queued_on_a_replica_as_cached_there():
    r = router("kv-exact", 2)
    prompt = request(0, (1, 16))  # 4 blocks
    # replica 0 caches nothing yet, but a request queued there (its 8 prompt tokens counted as queued
    # prefill) shares 3 blocks: (8 + 16 - 12) / 4 + 5 + 1 = 9 against replica 1's 4 + 6 = 10
    assert r.choose(prompt, [View(blocks=5, queued=8, inflight=12), View(blocks=6)]) == 0
    assert r.choose(prompt, [View(blocks=5, queued=8), View(blocks=6)]) == 1  # without it: 6 + 9 > 10
    # the larger of the two counts, not their sum: they may cover the same blocks
    assert r.choose(prompt, [View(blocks=5, queued=8, cached=8, inflight=12), View(blocks=6)]) == 0
    assert r.choose(prompt, [View(blocks=5, queued=8, cached=12, inflight=8), View(blocks=6)]) == 0
