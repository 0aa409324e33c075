"""Contiguous reservation: reservation sizes, placement policies, external fragmentation (docs/memory.md)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.allocators import registry
from workbench.allocators.values import SeqSpec


def spec(num_tokens, final_len):
    return SeqSpec(np.zeros(num_tokens, dtype=np.int32), final_len)


@pytest.mark.parametrize("fit", ["first", "best", "buddy"])
def test_15728_slots_hold_exactly_seven_max_length_reservations(fit):
    s = registry.create("contiguous-max", capacity_slots=15_728, fit=fit, max_model_len=2048)
    for i in range(7):
        assert s.admit([i], spec(100, 300)).admitted
    refused = s.admit([7], spec(100, 300))
    assert not refused.admitted and refused.needed_extent_slots == 2048
    snap = s.snapshot(refused.needed_extent_slots)
    assert snap.external_frag_slots == 1392 and snap.free_slots == 0
    assert (snap.token_slots, snap.reserved_slots, snap.internal_frag_slots) == (700, 1400, 7 * 2048 - 2100)
    assert s.snapshot().external_frag_slots == 0 and s.snapshot().free_slots == 1392  # no refusal, no external
    s.check_integrity()


def test_first_fit_refuses_what_total_free_space_could_hold_and_paged_does_not():
    s = registry.create("contiguous-oracle", capacity_slots=100, fit="first", max_model_len=100)
    for i, final in enumerate([30, 30, 30]):
        assert s.admit([i], spec(10, final)).admitted
    s.free(0)
    s.free(2)  # free runs: [0, 30) and [60, 100): 70 slots, none of 50
    refused = s.admit([3], spec(10, 50))
    assert not refused.admitted and refused.needed_extent_slots == 50
    snap = s.snapshot(refused.needed_extent_slots)
    assert snap.external_frag_slots == 70 and snap.free_slots == 0 and snap.largest_free_extent_slots == 40

    p = registry.create("paged", capacity_slots=100, block_size=10, max_model_len=100)
    for i, final in enumerate([30, 30, 30]):
        p.admit([i], spec(30, final))
    p.free(0)
    p.free(2)
    assert p.admit([3], spec(50, 50)).admitted
    assert p.snapshot().external_frag_slots == 0


def test_first_fit_takes_the_lowest_run_and_best_fit_the_tightest():
    starts = {}
    for fit in ("first", "best"):
        s = registry.create("contiguous-oracle", capacity_slots=100, fit=fit, max_model_len=100)
        for i, final in enumerate([40, 20, 30, 10]):
            s.admit([i], spec(1, final))
        s.free(0)
        s.free(2)  # free runs [0, 40) and [60, 90)
        s.admit([9], spec(1, 25))
        starts[fit] = s.describe([9]).kv_start.tolist()
        s.check_integrity()
    assert starts == {"first": [0], "best": [60]}


def test_buddy_rounds_up_to_a_power_of_two_and_counts_it_as_internal_fragmentation():
    s = registry.create("contiguous-oracle", capacity_slots=128, fit="buddy", max_model_len=128)
    s.admit([0], spec(10, 20))  # 32 at 0
    s.admit([1], spec(10, 60))  # 64 at 64
    s.admit([2], spec(10, 10))  # 16 at 32
    assert s.describe([0, 1, 2]).kv_start.tolist() == [0, 64, 32]
    snap = s.snapshot()
    assert snap.internal_frag_slots == (32 - 20) + (64 - 60) + (16 - 10)
    assert snap.largest_free_extent_slots == 16 and snap.num_free_blocks == 16
    s.free(0)
    s.free(2)  # 0..63 merges back into one buddy block
    assert s.snapshot().largest_free_extent_slots == 64
    s.check_integrity()


def test_buddy_regions_follow_the_binary_digits_of_the_capacity():
    s = registry.create("contiguous-oracle", capacity_slots=96, fit="buddy", max_model_len=96)
    assert s.admit([0], spec(1, 40)).admitted  # 64 at 0; the 32-slot region at 64 cannot serve 64
    assert not s.admit([1], spec(1, 40)).admitted
    assert s.admit([2], spec(1, 30)).admitted and s.describe([2]).kv_start.tolist() == [64]


@pytest.mark.parametrize("final,reserved", [(1, 1), (100, 128), (128, 128), (129, 256), (1500, 2000)])
def test_pow2_reserves_the_next_power_of_two_capped_at_max_model_len(final, reserved):
    s = registry.create("contiguous-pow2", capacity_slots=4000, fit="first", max_model_len=2000)
    s.admit([0], spec(1, final))
    assert s.snapshot().internal_frag_slots == reserved - final


def test_a_group_is_placed_all_or_nothing():
    s = registry.create("contiguous-oracle", capacity_slots=100, fit="first", max_model_len=100)
    before = s.snapshot()
    result = s.admit([0, 1, 2], spec(10, 40))  # two extents of 40 fit, three do not
    assert not result.admitted and s.snapshot() == before
    s.check_integrity()


def test_fork_copies_the_parents_written_slots_into_a_new_extent():
    s = registry.create("contiguous-max", capacity_slots=100, fit="first", max_model_len=40)
    s.admit([0], spec(5, 30))
    s.append([0])
    result = s.fork(0, 1)
    assert result.admitted and result.copies.tolist() == [[i, 40 + i] for i in range(6)]
    assert s.append([0, 1]).slots.tolist() == [6, 46]
    refused = s.fork(0, 2)
    assert not refused.admitted and refused.needed_extent_slots == 40


def test_describe_and_slot_mapping():
    s = registry.create("contiguous-pow2", capacity_slots=100, fit="first", max_model_len=64)
    s.admit([5], spec(3, 9))
    s.admit([6], spec(2, 4))
    d = s.describe([6, 5])
    assert d.kv_start.tolist() == [16, 0] and d.kv_len.tolist() == [2, 3] and d.kv_start.dtype == np.int32
    assert s.slot_mapping(6, 0, 2).tolist() == [16, 17]
    assert s.snapshot().block_table_bytes == 16


def test_contiguous_swap_moves_written_slots_and_reserves_again_on_swap_in():
    s = registry.create("contiguous-max", capacity_slots=120, fit="first", max_model_len=40, swap_slots=8)
    s.admit([0, 1], spec(3, 30))  # extents at 0 and 40
    out = s.swap_out([0, 1])
    assert out.moves.tolist() == [[0, 0], [1, 1], [2, 2], [40, 3], [41, 4], [42, 5]]
    snap = s.snapshot()
    assert snap.free_slots == 120 and snap.token_slots == 0 and snap.block_table_bytes == 0
    with pytest.raises(ValueError, match="swapped out"):
        s.append([0])
    s.admit([2], spec(1, 30))  # takes [0, 40)
    assert s.can_swap_in([0, 1])
    back = s.swap_in([0, 1])
    assert back.moves.tolist() == [[0, 40], [1, 41], [2, 42], [3, 80], [4, 81], [5, 82]]
    assert s.describe([0, 1]).kv_start.tolist() == [40, 80]
    assert s.can_swap_out([0, 1, 2])  # 3 + 3 + 1 written slots fit the 8 host slots
    s.append([0, 1])
    assert not s.can_swap_out([0, 1, 2])
    before = s.snapshot()
    with pytest.raises(RuntimeError, match="no host extents"):
        s.swap_out([0, 1, 2])
    assert s.snapshot() == before
    s.check_integrity()


def test_without_host_space_contiguous_strategies_cannot_swap():
    s = registry.create("contiguous-oracle", capacity_slots=100, fit="first", max_model_len=40)
    s.admit([0], spec(3, 30))
    assert not s.can_swap_out([0])
