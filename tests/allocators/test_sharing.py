"""Parallel sampling: n = 4 samples of a 100-token prompt share its blocks (docs/memory.md, docs/strategies.md)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.allocators import registry
from workbench.allocators.values import SeqSpec

PROMPT = SeqSpec(np.arange(100, dtype=np.int32), final_len=120)
# every strategy with block tables shares blocks by reference count, whatever else it does
BLOCK_TABLE_STRATEGIES = [r.name for r in registry.registrations() if r.kernel_mode == "paged"]


@pytest.mark.parametrize("name", BLOCK_TABLE_STRATEGIES)
def test_four_samples_share_the_prompt_and_copy_the_partial_block_once_per_writer_but_the_last(name):
    s = registry.create(name, capacity_slots=64 * 16, block_size=16, max_model_len=200)
    assert s.admit([0, 1, 2, 3], PROMPT).admitted
    d = s.describe([0, 1, 2, 3])
    assert d.kv_indices.tolist() == list(range(7)) * 4  # 6 full blocks + block 6 holding 4 tokens, shared
    snap = s.snapshot()
    assert snap.token_slots == 100 and snap.logical_token_slots == 400
    assert snap.reserved_slots == 12 and snap.internal_frag_slots == 0  # block 6 is filled by one sample only

    step = s.append([0, 1, 2, 3])
    assert step.copies.tolist() == [[6, 7], [6, 8], [6, 9]]  # the 4th sample is the last holder: in place
    assert step.slots.tolist() == [7 * 16 + 4, 8 * 16 + 4, 9 * 16 + 4, 6 * 16 + 4]
    snap = s.snapshot()
    assert snap.token_slots == 96 + 4 * 5  # 6 shared full blocks + four private partial blocks of 5
    assert snap.reserved_slots == 4 * 11 and snap.logical_token_slots == 404
    assert 1 - snap.token_slots / snap.logical_token_slots == pytest.approx(1 - 116 / 404)
    later = s.append([0, 1, 2, 3])
    assert later.copies.shape == (0, 2)
    s.check_integrity()


def test_shared_partial_block_slots_count_once_by_the_furthest_reaching_holder():
    s = registry.create("paged", capacity_slots=64 * 16, block_size=16, max_model_len=200)
    s.admit([0, 1], SeqSpec(np.arange(100, dtype=np.int32), final_len=101))
    assert s.fork(0, 2).admitted
    # block 6 holds positions 96..111; written 96..99; the holders reach at most position 100
    snap = s.snapshot()
    assert (snap.token_slots, snap.reserved_slots, snap.internal_frag_slots) == (100, 1, 11)


def test_contiguous_samples_get_their_own_extents_and_prompt_copies():
    s = registry.create("contiguous-oracle", capacity_slots=1000, fit="first", max_model_len=200)
    result = s.admit([0, 1, 2, 3], PROMPT)
    assert result.admitted
    assert s.describe([0, 1, 2, 3]).kv_start.tolist() == [0, 120, 240, 360]
    assert result.copies.shape == (300, 2)
    assert result.copies[:2].tolist() == [[0, 120], [1, 121]] and result.copies[-1].tolist() == [99, 459]
    snap = s.snapshot()
    assert snap.token_slots == 400 == snap.logical_token_slots and snap.reserved_slots == 80
