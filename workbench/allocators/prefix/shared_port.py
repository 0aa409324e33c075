"""One replica's side of the fleet's shared tier (`prefix.shared_tier`): its moves and its counters.

The pool is one object for the whole fleet; what a replica moves in or out of it is this replica's
own, handed to its engine once per step (`take_moves`) like its host tier's moves. Three kinds, each
int32 [k, 2], executed by the kernel runner in this order (`engine.runner`):

- spill (host-tier block, shared block): an entry the replica's own host tier dropped, read before
  the step's device → host demotes overwrite its host block;
- demote (device block, shared block): a block evicted from the device with no host tier, or one
  that had no room for it, read before anything of the step writes the device;
- promote (shared block, device block): a shared hit copied into a fresh device block.

The pool pins every shared block these moves touch until the step ends, so no shared block is
written twice in a step nor overwritten before a promote has read it.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.prefix.shared_tier import NOT_STORED, SharedTier
from workbench.allocators.values import NO_PAIRS


def _pairs(moves: list[tuple[int, int]]) -> np.ndarray:
    return np.array(moves, dtype=np.int32).reshape(-1, 2) if moves else NO_PAIRS


class SharedTierPort:
    def __init__(self, tier: SharedTier) -> None:
        self.tier = tier
        self._spills: list[tuple[int, int]] = []  # (host-tier block, shared block)
        self._demotes: list[tuple[int, int]] = []  # (device block, shared block)
        self._promotes: list[tuple[int, int]] = []  # (shared block, device block)
        self.loaded_blocks = 0  # shared → device copies by this replica so far
        self.demoted_blocks = 0  # device or host tier → shared copies by this replica so far

    def lookup(self, keys: np.ndarray) -> int:
        """Pure. How many leading `keys` (uint64 [k]) the shared tier holds."""
        return self.tier.lookup(keys)

    def read(self, keys: np.ndarray) -> np.ndarray:
        """Mutates the pool. The shared blocks of `keys` (a `lookup` run), int32 [k], kept for this step."""
        return self.tier.read(keys)

    def promote(self, shared_blocks: np.ndarray, device_blocks: np.ndarray) -> None:
        """Mutates. Record the copies shared block -> device block (int32 [k] each), after `read`."""
        self._promotes.extend(zip(shared_blocks.tolist(), device_blocks.tolist(), strict=True))
        self.loaded_blocks += shared_blocks.shape[0]

    def demote(self, keys: np.ndarray, device_blocks: np.ndarray) -> None:
        """Mutates. Device blocks (int32 [k]) evicted under `keys` (uint64 [k]) are copied into the pool."""
        shared = self.tier.store(keys)
        kept = shared != NOT_STORED
        self._demotes.extend(zip(device_blocks[kept].tolist(), shared[kept].tolist(), strict=True))
        self.demoted_blocks += int(np.count_nonzero(kept))

    def take_dropped(self, dropped: list[tuple[int, int, int]]) -> None:
        """Mutates. What the replica's host tier let go (`HostTier.demote`: (key, host block, -1) for an
        entry it dropped, (key, -1, device block) for an evicted block it had no room for) is copied into
        the pool from where its KV is."""
        if not dropped:
            return
        keys = np.array([key for key, _, _ in dropped], dtype=np.uint64)
        shared = self.tier.store(keys)
        for (_, host, device), block in zip(dropped, shared.tolist(), strict=True):
            if block == NOT_STORED:
                continue
            if host >= 0:
                self._spills.append((host, block))
            else:
                self._demotes.append((device, block))
            self.demoted_blocks += 1

    def take_moves(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Mutates. The step ends: its (spills, demotes, promotes), and the pool unpins its blocks."""
        moves = _pairs(self._spills), _pairs(self._demotes), _pairs(self._promotes)
        self._spills, self._demotes, self._promotes = [], [], []
        self.tier.end_step()
        return moves
