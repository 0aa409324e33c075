"""Hand-worked checkpoint policies (docs/recurrent.md): which positions each checkpoints, which request hits how
many tokens, and which checkpoint goes first."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.allocators import registry
from workbench.allocators.state.book import StateBook, StateSpec
from workbench.allocators.state.policies import POLICIES, boundaries, eviction_rank
from workbench.allocators.values import SeqSpec

BS = 16


def _steps(policy: str, branch: int = 0) -> list[int]:
    """A 100-token prompt prefilled in chunks ending at 40, 80 and 100, then decoded one token a step to 140."""
    spans = [(0, 40), (40, 80), (80, 100)] + [(p - 1, p) for p in range(101, 141)]
    return [b for start, stop in spans for b in boundaries(policy, start, stop, BS, 100, 140, branch)]


def test_each_policy_checkpoints_its_boundaries():
    assert _steps("none") == []
    assert _steps("all") == [16, 32, 48, 64, 80, 96, 112, 128]
    # step ends on a boundary (80 and each decoded block) and the prompt's last full block, where vLLM splits
    assert _steps("align") == [80, 96, 112, 128]
    assert _steps("tree") == [96, 128]  # the prompt's end after prefill, the sequence's end at finish
    assert _steps("marconi", branch=32) == [32, 128]  # the branch point and the end of input + output
    assert _steps("marconi") == [128]


def _strategy(name: str, policy: str, cache_states: int = 64):
    return registry.create(name, capacity_slots=4096, block_size=BS, max_model_len=512,
                           state=StateSpec(2, 20, policy, 2 * cache_states, 2.0, 1.0))


def _admit(s, seq_id: int, tokens: np.ndarray) -> int:
    result = s.admit([seq_id], SeqSpec(tokens.astype(np.int32), tokens.shape[0]))
    assert result.admitted
    s.check_integrity()
    return result.cached_tokens


A = np.arange(1000, 1100)  # 100 tokens
B = np.concatenate([A[:70], np.arange(5000, 5030)])  # shares 70 tokens (4 full blocks) with A
C = np.concatenate([A[:70], np.arange(6000, 6030)])  # shares the same 70 with A and B


@pytest.mark.parametrize("name", ["paged-prefix", "radix"])
@pytest.mark.parametrize("policy,hits", [("none", (0, 0)), ("all", (64, 64)), ("align", (0, 0)), ("tree", (0, 0)),
                                         ("marconi", (0, 64))])
def test_which_request_hits_how_many_tokens(name, policy, hits):
    """A is prefilled whole and freed; B and then C share A's first four blocks. The KV index holds them for
    every policy; the state at 64 exists only under `all` (every block), or under `marconi` once B branched there."""
    s = _strategy(name, policy)
    assert _admit(s, 0, A) == 0
    s.free(0)
    assert s.prefix.lookup(np.asarray(s._chains.prompt_keys(B.astype(np.int32))), 6).shape[0] == 4
    assert (_admit(s, 1, B), _admit(s, 2, C)) == hits
    positions = sorted(entry[1] for entry in s.state.checkpoints.values())
    # A, B and C each checkpoint their own 96 (the prompts' last full block) under every policy but none;
    # `all` adds A's 16..80 and B's and C's 80; marconi adds the branch at 64 (B's, which C then hits)
    expected = {"none": [], "all": [16, 32, 48, 64, 80, 80, 80, 96, 96, 96], "align": [96, 96, 96],
                "tree": [96, 96, 96], "marconi": [64, 96, 96, 96]}[policy]
    if name == "radix" and policy in ("align", "tree", "marconi"):
        # a radix tree registers a sequence's blocks only below blocks it holds: a request that recomputed A's
        # four blocks (no state at 64 to resume: B, and C without marconi's branch) keeps its later blocks, and
        # the checkpoint at its 96, out of the tree
        expected = {"align": [96], "tree": [96], "marconi": [64, 96, 96]}[policy]
    assert positions == expected
    assert s.snapshot().state_checkpoint_slots == len(expected) * 2 * BS  # two blocks each


def test_none_keeps_the_kv_and_hits_nothing():
    s = _strategy("paged-prefix", "none")
    _admit(s, 0, A)
    s.free(0)
    assert s.snapshot().cached_slots == 6 * BS  # A's six full blocks stay cached, unusable without state
    assert _admit(s, 1, A) == 0 and s.state.checkpoints == {}


def test_a_hit_restores_a_checkpoint_and_counts_the_copies():
    s = _strategy("paged-prefix", "all")
    _admit(s, 0, A)
    assert s.end_step().state_copies == 6  # 16, 32, ..., 96
    s.free(0)
    assert _admit(s, 1, A) == 96
    assert s.end_step().state_copies == 1  # the hit's checkpoint copied into the new state; nothing new to save
    assert s.counters()["state_checkpoint_hits"] == 1


def _book(policy: str) -> StateBook:
    book = StateBook(StateSpec(1, 10, policy, 3, 2.0, 1.0), BS)
    for key, position in ((1, 96), (2, 16), (3, 32)):  # saved in this order: 96 is the least recently used
        book.save(key, position, np.array([key], dtype=np.int32))
    return book


def test_lru_evicts_the_least_recently_used_and_marconi_the_least_useful():
    lru, marconi = _book("all"), _book("marconi")
    assert lru.evict(1).tolist() == [1]  # 96: oldest
    # Marconi: recency (96: 0, 16: 0.5, 32: 1) + FLOP efficiency (96: 1, 16: 0, 32: ~0.09): 16 is worth least
    assert marconi.evict(1).tolist() == [2]
    assert sorted(marconi.checkpoints) == [1, 3]


def test_a_hit_refreshes_a_checkpoint_and_the_pinned_one_is_never_evicted():
    book = _book("all")
    book.use(1)  # 96 is now the most recently used, and pinned
    assert book.evictable() == 2
    assert book.evict(2).tolist() == [2, 3]
    with pytest.raises(RuntimeError, match="out of checkpoints"):
        book.evict(1)
    book.land()
    assert book.evictable() == 1


def test_the_budget_evicts_before_a_checkpoint_is_added():
    book = _book("all")
    assert book.make_room().tolist() == [1]  # 3 held, budget 3: one goes for the next
    assert book.held_blocks() == 2


def test_a_budget_of_one_pinned_checkpoint_takes_no_other():
    book = StateBook(StateSpec(1, 10, "tree", 1), BS)
    book.save(7, 16, np.array([3], dtype=np.int32))
    book.use(7)
    assert book.make_room() is None and list(book.checkpoints) == [7]
    book.land()
    assert book.make_room().tolist() == [3]


def test_a_checkpoint_goes_with_the_block_it_ends_on():
    book = _book("all")
    assert book.drop(np.array([3, 99], dtype=np.uint64)).tolist() == [3]
    assert sorted(book.checkpoints) == [1, 2] and book.evicted == 1


@pytest.mark.parametrize("policy", POLICIES)
def test_eviction_rank_orders_every_checkpoint_once(policy):
    last_use = np.array([5, 1, 9, 3])
    flops = np.array([10.0, 400.0, 1.0, 50.0])
    order = eviction_rank(policy, last_use, flops)
    assert sorted(order.tolist()) == [0, 1, 2, 3]
    if policy != "marconi":
        assert order.tolist() == [1, 3, 0, 2]
