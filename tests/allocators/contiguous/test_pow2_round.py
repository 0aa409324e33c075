"""contiguous-pow2's two roundings: the final length, or the output alone (the vLLM paper's Orca Pow2)."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.allocators.contiguous.pow2 import ContiguousPow2, next_pow2
from workbench.allocators.values import SeqSpec


def _pow2(round_: str, capacity_slots: int = 4096) -> ContiguousPow2:
    return ContiguousPow2(capacity_slots=capacity_slots, max_model_len=2048, fit="first", pow2_round=round_)


@pytest.mark.parametrize("prompt,final,by_final,by_output", [
    (100, 125, 128, 132),     # the paper's example: 25 output tokens reserve 32
    (10, 11, 16, 11),         # one output token: 10 + 1
    (1000, 1500, 2048, 1512),  # the final length rounds to the 2048 cap
    (1800, 2000, 2048, 2048),  # 1800 + 256 > 2048: capped
    (64, 64, 64, 64),          # nothing left to generate
])
def test_reservation_rounds_the_final_length_or_the_output(prompt, final, by_final, by_output):
    assert _pow2("final").reservation_slots(final, prompt) == min(by_final, 2048)
    assert _pow2("output").reservation_slots(final, prompt) == by_output


def test_output_rounding_places_that_extent_and_reports_its_slack_as_internal():
    pool = _pow2("output")
    assert pool.admit([0], SeqSpec(np.arange(100, dtype=np.int32), 125)).admitted
    snap = pool.snapshot()
    assert snap.token_slots + snap.reserved_slots + snap.internal_frag_slots == 132
    assert snap.internal_frag_slots == 132 - 125
    pool.check_integrity()


def test_next_pow2_and_a_bad_rounding():
    assert [next_pow2(n) for n in (0, 1, 2, 3, 4, 5, 1025)] == [1, 1, 2, 4, 4, 8, 2048]
    with pytest.raises(ValueError, match="pow2_round 'total'"):
        _pow2("total")
