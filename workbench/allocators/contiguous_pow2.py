"""`contiguous-pow2`: reserve the next power of two >= the final length (Orca Pow2: at most 2x over).

Capped at `max_model_len`, which no sequence exceeds (so a 1,500-token sequence under a 2,000-token
limit reserves 2,000, not 2,048).
"""

from __future__ import annotations

from workbench.allocators.contiguous import ContiguousStrategy


class ContiguousPow2(ContiguousStrategy):
    name = "contiguous-pow2"

    def reservation_slots(self, final_len: int) -> int:
        return min(1 << (final_len - 1).bit_length(), self.max_model_len)
