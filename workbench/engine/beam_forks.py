"""Beam search on the strategy: each step's survivors replace the beams (workbench.workload.beam).

Beams with no survivor are freed first, so that a fork (which shares all of the parent's blocks and
copies on the next write) never needs more memory than the freed beams held.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from workbench.allocators.base import Strategy
from workbench.allocators.values import NO_PAIRS
from workbench.engine.groups import Group
from workbench.engine.tokens import TokenStore
from workbench.workload.beam import beam_step


class BeamForks:
    """Forks and prunes beam groups; collects the forks and their copy-on-write pairs for the next step."""

    def __init__(self, strategy: Strategy, tokens: TokenStore, seed: int, new_seq_id: Callable[[], int],
                 branch_frac: float = 1.0) -> None:
        self.strategy = strategy
        self.tokens = tokens
        self.seed = seed
        self.branch_frac = branch_frac  # share of decode steps that re-rank the beams (workbench.workload.beam)
        self.new_seq_id = new_seq_id
        self._forks: list[tuple[int, int]] = []  # (parent, child) since the last `take`
        self._copies: list[np.ndarray] = []  # int32 [k, 2] each fork's copy pairs (NO_PAIRS: none), in fork order
        self._taken: tuple[list[tuple[int, int]], list[np.ndarray]] = ([], [])  # what the last `take` gave

    def advance(self, g: Group) -> bool:
        """Mutates the strategy, the token store and `g.seq_ids`. The group just produced token
        s = generated - 1: its beams become the survivors of `beam_step`. Returns whether the group's
        sequence ids changed."""
        if g.generated >= g.request.output_tokens:
            return False  # finishes now: the survivors would be freed at once
        s = g.generated - 1
        beams = beam_step(g.request, s, self.seed, self.branch_frac)
        old_ids = g.seq_ids
        old_tokens = [self.tokens.beam(seq_id) for seq_id in old_ids]
        if s == 0:  # every beam already holds the prompt (admitted together): beam i takes token i
            for i, seq_id in enumerate(old_ids):
                self.tokens.set_beam(seq_id, [beams.token_ids[i]])
            return False
        for b in beams.freed:
            self.strategy.free(old_ids[b])
            self.tokens.remove(old_ids[b])
        new_ids: list[int] = []
        continued: set[int] = set()
        for i, parent in enumerate(beams.parents):
            parent_id = old_ids[parent]
            beam_tokens = old_tokens[parent] + [beams.token_ids[i]]
            if parent not in continued:
                continued.add(parent)
                new_ids.append(parent_id)
                self.tokens.set_beam(parent_id, beam_tokens)
                continue
            child_id = self.new_seq_id()
            result = self.strategy.fork(parent_id, child_id)
            if not result.admitted:  # a fork replaces a freed beam of the same size
                raise RuntimeError(f"request {g.request.request_id}: beam fork refused after freeing "
                                   f"{len(beams.freed)} beams: {result.reason}")
            self._copies.append(NO_PAIRS if result.copies is None else result.copies)
            self._forks.append((parent_id, child_id))
            self.tokens.fork(parent_id, child_id, beam_tokens)
            new_ids.append(child_id)
        g.seq_ids = new_ids
        return True

    def take(self) -> tuple[list[tuple[int, int]], list[np.ndarray]]:
        """Mutates. The forks made since the last call and their copy-on-write pairs."""
        forks, copies = self._forks, self._copies
        self._taken = (forks, copies)
        self._forks, self._copies = [], []
        return forks, copies

    def withdraw(self, seq_ids: list[int], swap_out: list[np.ndarray] | None) -> None:
        """Mutates the lists the last `take` gave and, for a group just swapped out, its moves (the last of
        `swap_out`). The group of `seq_ids` leaves the device in the step it forked in: the kernel runner would
        read its slots for the swap-out before the forks' copies write them, and then write them into slots
        the strategy has released. So its forks' copies are not made, and its swap-out reads each forked
        beam's slots where the copies would have taken them from: the parent's."""
        forks, copies = self._taken
        mine = [k for k, (_, child) in enumerate(forks) if child in seq_ids and len(copies[k])]
        if not mine:
            return
        pairs = np.concatenate([copies[k] for k in mine])  # (source, destination) slots
        for k in mine:
            copies[k] = NO_PAIRS
        if swap_out is not None:
            moves = swap_out[-1].copy()
            order = np.argsort(pairs[:, 1], kind="stable")
            dst, src = pairs[order, 1], pairs[order, 0]
            at = np.minimum(np.searchsorted(dst, moves[:, 0]), dst.shape[0] - 1)
            forked = dst[at] == moves[:, 0]
            moves[forked, 0] = src[at[forked]]
            swap_out[-1] = moves
