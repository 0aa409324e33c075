"""`contiguous-max`: reserve `max_model_len` slots per sequence (Orca Max, FasterTransformer)."""

from __future__ import annotations

from workbench.allocators.contiguous.strategy import ContiguousStrategy


class ContiguousMax(ContiguousStrategy):
    name = "contiguous-max"

    def reservation_slots(self, final_len: int, num_tokens: int) -> int:
        return self.max_model_len
