"""`contiguous-oracle`: reserve exactly the final length (Orca Oracle: knows the output length)."""

from __future__ import annotations

from workbench.allocators.contiguous.strategy import ContiguousStrategy


class ContiguousOracle(ContiguousStrategy):
    name = "contiguous-oracle"

    def reservation_slots(self, final_len: int, num_tokens: int) -> int:
        return final_len
