"""`contiguous-pow2`: reserve a power of two (Orca Pow2: at most 2x over).

`pow2_round = final` (the default) rounds the final length (prompt + output) up to a power of two;
`output` keeps the prompt exact and rounds only the output, as the vLLM paper's Orca (Pow2) did
("if the actual output length is 25, it reserves 32 positions for outputs", §6.1). A sequence placed
again (swapped in, forked) rounds what it has still to generate. Capped at `max_model_len`, which no
sequence exceeds (so a 1,500-token sequence under a 2,000-token limit reserves 2,000, not 2,048).
"""

from __future__ import annotations

from workbench.allocators.contiguous.strategy import ContiguousStrategy

POW2_ROUNDS = ("final", "output")


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


class ContiguousPow2(ContiguousStrategy):
    name = "contiguous-pow2"

    def __init__(self, *, pow2_round: str = "final", **kw) -> None:
        if pow2_round not in POW2_ROUNDS:
            raise ValueError(f"pow2_round {pow2_round!r} is not one of {', '.join(POW2_ROUNDS)}")
        super().__init__(**kw)
        self.pow2_round = pow2_round

    def reservation_slots(self, final_len: int, num_tokens: int) -> int:
        if self.pow2_round == "output":
            # a sequence with nothing left to generate reserves exactly what it holds
            rounded = num_tokens + (next_pow2(final_len - num_tokens) if final_len > num_tokens else 0)
        else:
            rounded = next_pow2(final_len)
        return min(rounded, self.max_model_len)
