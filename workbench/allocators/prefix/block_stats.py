"""The eviction policies of `prefix.eviction` as per-block statistics in arrays, for a tree index.

Same statistics, same logical clock and same priorities as the heap policies (`eviction.py`: one tick
per use, smallest priority evicted first), but recorded for many blocks at once: `use(blocks)` gives
the blocks consecutive ticks in array order, exactly as that many single uses would. A tree index keeps
its own heap of leaves and asks for one block's priority (`priority`) or compares a run of blocks against
another priority (`precede`), so a run of blocks whose priorities come before the next leaf's is evicted
in one step. Every priority ends with the block's last (or first) use tick, unique per block, so
priorities never tie.

Arrays are indexed by block id and grow on demand (`fit`).
"""

from __future__ import annotations

import numpy as np


class BlockStats:
    """The shared clock and storage; a subclass says what a use records and the priority."""

    _arrays: tuple[str, ...] = ()  # names of the int64 [num_blocks] statistic arrays
    _fill = 0  # value of a block with no statistics

    def __init__(self) -> None:
        self._tick = 0  # logical clock: one tick per use
        for name in self._arrays:
            setattr(self, name, np.full(0, self._fill, dtype=np.int64))

    def fit(self, num_blocks: int) -> None:
        """Mutates. Room for block ids below `num_blocks`."""
        for name in self._arrays:
            old = getattr(self, name)
            if old.shape[0] < num_blocks:
                grown = np.full(max(num_blocks, 2 * old.shape[0]), self._fill, dtype=np.int64)
                grown[:old.shape[0]] = old
                setattr(self, name, grown)

    def use(self, blocks: np.ndarray) -> None:
        """Mutates. Each of `blocks` (distinct, int [k]) is used once, in array order."""
        ticks = np.arange(self._tick + 1, self._tick + 1 + blocks.shape[0], dtype=np.int64)
        self._tick += blocks.shape[0]
        self._record(blocks, ticks)

    def _record(self, blocks: np.ndarray, ticks: np.ndarray) -> None:
        raise NotImplementedError

    def forget(self, blocks: np.ndarray) -> None:
        """Mutates. These blocks were evicted: their next content starts with no statistics."""
        del blocks  # a policy that only records the last use overwrites it at the next one

    def set_depth(self, blocks: np.ndarray | int, depths: np.ndarray | int) -> None:
        """Mutates. `blocks` (int32 [k], or one block id) were registered at prefix depths `depths` (0: a prompt's
        first block)."""
        del blocks, depths  # only `depth` orders by depth

    def priority(self, block: int) -> tuple[int, ...]:
        """Pure. The block's priority (smallest evicted first)."""
        raise NotImplementedError

    def precede(self, blocks: np.ndarray, other: tuple[int, ...]) -> np.ndarray:
        """Pure. Whether each block's priority comes before `other`, bool [k]."""
        raise NotImplementedError


class LastUseStats(BlockStats):
    """`lru`: the last use."""

    _arrays = ("last",)

    def _record(self, blocks: np.ndarray, ticks: np.ndarray) -> None:
        self.last[blocks] = ticks

    def priority(self, block: int) -> tuple[int, ...]:
        return (int(self.last[block]),)

    def precede(self, blocks: np.ndarray, other: tuple[int, ...]) -> np.ndarray:
        return self.last[blocks] < other[0]


class FirstUseStats(BlockStats):
    """`fifo`: the first use since the block was registered (-1: none yet)."""

    _arrays = ("first",)
    _fill = -1

    def _record(self, blocks: np.ndarray, ticks: np.ndarray) -> None:
        first = self.first[blocks]
        self.first[blocks] = np.where(first < 0, ticks, first)

    def forget(self, blocks: np.ndarray) -> None:
        self.first[blocks] = -1

    def priority(self, block: int) -> tuple[int, ...]:
        return (int(self.first[block]),)

    def precede(self, blocks: np.ndarray, other: tuple[int, ...]) -> np.ndarray:
        return self.first[blocks] < other[0]


class _PairStats(BlockStats):
    """Priority (a, last use): `_major` gives a, ties (never between distinct blocks' last uses) by recency."""

    def _major(self, blocks) -> np.ndarray:
        raise NotImplementedError

    def priority(self, block: int) -> tuple[int, ...]:
        return (int(self._major(block)), int(self.last[block]))

    def precede(self, blocks: np.ndarray, other: tuple[int, ...]) -> np.ndarray:
        major = self._major(blocks)
        return (major < other[0]) | ((major == other[0]) & (self.last[blocks] < other[1]))


class UseCountStats(_PairStats):
    """`lfu`: uses since registration, then the last use."""

    _arrays = ("uses", "last")

    def _record(self, blocks: np.ndarray, ticks: np.ndarray) -> None:
        self.uses[blocks] += 1
        self.last[blocks] = ticks

    def forget(self, blocks: np.ndarray) -> None:
        self.uses[blocks] = 0

    def _major(self, blocks):
        return self.uses[blocks]


class DepthStats(_PairStats):
    """`depth`: the deepest prefix position first, then the last use."""

    _arrays = ("depth", "last")

    def _record(self, blocks: np.ndarray, ticks: np.ndarray) -> None:
        self.last[blocks] = ticks

    def set_depth(self, blocks: np.ndarray | int, depths: np.ndarray | int) -> None:
        self.depth[blocks] = depths

    def _major(self, blocks):
        return -self.depth[blocks]


BLOCK_STATS = {"lru": LastUseStats, "fifo": FirstUseStats, "lfu": UseCountStats, "depth": DepthStats}


def make_block_stats(name: str) -> BlockStats:
    """Fresh statistics for the `--eviction` policy `name` (the choices of `eviction.POLICIES`)."""
    if name not in BLOCK_STATS:
        raise ValueError(f"unknown eviction policy {name!r}; valid: {', '.join(BLOCK_STATS)}")
    return BLOCK_STATS[name]()
