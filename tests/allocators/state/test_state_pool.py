"""A recurrent state's place in the pool (docs/recurrent.md): vLLM's split, one pool whose blocks serve KV and
states alike, and the sizes of the packed and unified layouts."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.allocators import registry
from workbench.allocators.state.book import StateSpec
from workbench.allocators.values import SeqSpec
from workbench.presets import GIB, MODELS
from workbench.state_pool import state_sizes, unified_block_size


def test_states_and_kv_come_from_one_pool():
    """8 blocks of 4: a 10-token prompt takes 3 blocks and its state 2, so one such request fits and a second
    does not, though its KV alone (3 blocks) would; freeing the first gives all 5 blocks back."""
    s = registry.create("paged", capacity_slots=32, block_size=4, max_model_len=32, state=StateSpec(2, 7))
    spec = SeqSpec(np.arange(10, dtype=np.int32), 12)
    assert s.admit([0], spec).admitted and s.num_allocatable_blocks() == 3
    refused = s.admit([1], spec)
    assert not refused.admitted and refused.reason == "needs 5 blocks, 3 allocatable"
    snap = s.snapshot()
    assert (snap.token_slots, snap.state_slots, snap.free_slots) == (10, 8, 12)
    s.free(0)
    assert s.num_allocatable_blocks() == 8 and s.snapshot().state_slots == 0
    s.check_integrity()


def test_a_group_takes_one_state_per_sequence():
    s = registry.create("paged", capacity_slots=64, block_size=4, max_model_len=32, state=StateSpec(2, 7))
    assert s.admit([0, 1, 2], SeqSpec(np.arange(8, dtype=np.int32), 12)).admitted
    assert s.snapshot().state_slots == 3 * 2 * 4 and s.num_allocatable_blocks() == 16 - 2 - 6
    s.check_integrity()


def test_packed_and_unified_sizes_of_qwen3_next():
    """24,576 B a token over its 12 attention layers; a state of 39,518,208 B = 1,608 slots. Packed at block 16:
    101 blocks. Unified: a layer's state (1,097,728 B) needs 34 pages of 16 tokens × 2,048 B, so the block is
    544 tokens and the 36 layers' states take 36 / 12 = 3 blocks."""
    m = MODELS["qwen3-next-80b-a3b"]
    pool_slots = 40 * GIB // m.kv_bytes_per_token("bf16")
    assert state_sizes(m, "bf16", 16, pool_slots, None, False)[:2] == (101, 1608)
    assert unified_block_size(m, 16, "bf16") == 544
    blocks, slots, budget = state_sizes(m, "bf16", 544, pool_slots, 4.0, True)
    assert (blocks, slots) == (3, 1608)
    # 4 GiB of checkpoints: 4 GiB / (544 × 24,576 B) = 321 blocks, 107 whole states
    assert budget == 321  # a multiple of 3: whole states


def test_a_checkpoint_budget_past_the_pool_is_refused():
    m = MODELS["qwen3.5-0.8b"]
    with pytest.raises(ValueError, match="exceeds the KV pool"):
        state_sizes(m, "bf16", 16, 1024 * 16, 1.0, False)
