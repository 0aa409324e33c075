"""Eviction policies of a prefix cache: which evictable block goes first.

A policy orders the *evictable* blocks only (registered in a prefix index, held by no sequence).
The index tells it when a block becomes evictable (`add`), stops being evictable because a hit
claimed it (`remove`), or is reused without leaving the set (`touch`); `pop_victim` names the next
block to evict. Policies know nothing of keys or tokens, so any index can use any policy.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

import numpy as np


class EvictionPolicy(Protocol):
    def add(self, block: int) -> None:
        """Mutates. `block` becomes evictable (it is not in the set)."""
        ...

    def remove(self, block: int) -> None:
        """Mutates. `block` leaves the evictable set; nothing happens if it is not in it."""
        ...

    def touch(self, block: int) -> None:
        """Mutates. `block` (in the set) was just used: the policy may reorder it."""
        ...

    def pop_victim(self) -> int:
        """Mutates. Remove and return the block to evict next; raises KeyError when empty."""
        ...

    def __len__(self) -> int:
        """Evictable blocks."""
        ...

    def ids(self) -> np.ndarray:
        """The evictable blocks, next victim first, int32 [len]. Pure."""
        ...


class LRUPolicy:
    """Least recently used first: blocks are evicted in the order they were added (or touched).

    With a freed request's blocks added tail first (what `PrefixIndex.release` does), its last
    block is evicted before its earlier ones: vLLM v1's free-block queue order."""

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()  # least recently used first

    def add(self, block: int) -> None:
        self._order[block] = None

    def remove(self, block: int) -> None:
        self._order.pop(block, None)

    def touch(self, block: int) -> None:
        self._order.move_to_end(block)

    def pop_victim(self) -> int:
        if not self._order:
            raise KeyError("no evictable block")
        block, _ = self._order.popitem(last=False)
        return block

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, block: int) -> bool:
        return block in self._order

    def ids(self) -> np.ndarray:
        return np.fromiter(self._order, dtype=np.int32, count=len(self._order))
