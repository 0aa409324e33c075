"""Eviction policies of a prefix cache: which evictable block goes first (`--eviction`).

A policy orders the *evictable* blocks only (registered in a prefix index, held by no sequence).
The index tells it when a block becomes evictable after a use (`add`: a release), becomes
evictable again with no new use (`restore`: a tree node that became a leaf when its last child was
evicted), stops being evictable (`remove`: a hit claimed it), or is used (`touch`: a hit; the block
need not be in the set, its statistics are kept while it stays registered); `pop_victim` names the
next block to evict and forgets its statistics (the block is reused for new content). Policies
know nothing of keys or tokens, so any index can use any policy.

Every policy but `lru` is a heap of (priority, entry number, block) with lazy deletion: a block's live
entry is the one whose number `_entry` remembers; older entries are skipped when popped. `lru` keeps the
same order in an ordered dict (a use always moves a block to the back). Priorities use a logical clock
(`_tick`, one tick per use), never wall time, so runs are reproducible.

| name | priority (smallest evicted first) |
|---|---|
| `lru` | last use: a freed request's tail first (added tail first), vLLM v1's free-queue order |
| `fifo` | first use since the block was registered: the oldest content goes first, hits do not help |
| `lfu` | number of uses, then last use (least frequently used; ties least recently) |
| `depth` | deepest prefix position first, then last use: a shared head outlives its tails |

`depth` uses what a trace's structure tells: a shared head (a system prompt, a conversation's early
turns) is reused by every request that hangs off it, a deep block by few.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Protocol

import numpy as np


class EvictionPolicy(Protocol):
    def add(self, block: int) -> None:
        """Mutates. `block` becomes evictable (it is not in the set); this counts as a use."""
        ...

    def add_many(self, blocks: list[int]) -> None:
        """Mutates. `add` each of `blocks` (distinct), in order."""
        ...

    def restore(self, block: int) -> None:
        """Mutates. `block` becomes evictable again without a new use (it is not in the set)."""
        ...

    def remove(self, block: int) -> None:
        """Mutates. `block` leaves the evictable set; nothing happens if it is not in it."""
        ...

    def touch(self, block: int) -> None:
        """Mutates. `block` (registered, in the set or not) was just used: the policy may reorder it."""
        ...

    def pop_victim(self) -> int:
        """Mutates. Remove and return the block to evict next, forgetting its statistics; raises
        KeyError when empty."""
        ...

    def pop_victims(self, k: int) -> list[int]:
        """Mutates. `pop_victim` k times (k <= len), the victims in order."""
        ...

    wants_depth: bool  # the index calls `set_depth` when it registers a block

    def set_depth(self, block: int, depth: int) -> None:
        """Mutates. `block` was registered at prefix depth `depth` (0: a prompt's first block)."""
        ...

    def __len__(self) -> int:
        """Evictable blocks."""
        ...

    def ids(self) -> np.ndarray:
        """The evictable blocks, next victim first, int32 [len]. Pure."""
        ...


class HeapPolicy:
    """The shared heap; a subclass says what a use records (`_use`) and the priority (`_priority`)."""

    wants_depth = False

    def __init__(self) -> None:
        self._heap: list[tuple] = []  # (*priority, entry number, block); stale entries skipped lazily
        self._entry: dict[int, int] = {}  # evictable block -> number of its live heap entry
        self._tick = 0  # logical clock: one tick per use
        self._next_entry = 0

    def _use(self, block: int) -> None:
        raise NotImplementedError

    def _priority(self, block: int) -> tuple:
        raise NotImplementedError

    def _forget(self, block: int) -> None:
        raise NotImplementedError

    def set_depth(self, block: int, depth: int) -> None:
        del block, depth  # only `DepthPolicy` orders by depth

    def _push(self, block: int) -> None:
        self._next_entry += 1
        self._entry[block] = self._next_entry
        heapq.heappush(self._heap, (*self._priority(block), self._next_entry, block))
        if len(self._heap) > 2 * len(self._entry) + 64:
            self._compact()

    def _compact(self) -> None:
        """Mutates. Drop stale entries (more than half the heap) and re-heapify."""
        self._heap = [e for e in self._heap if self._entry.get(e[-1]) == e[-2]]
        heapq.heapify(self._heap)

    def add(self, block: int) -> None:
        self._tick += 1
        self._use(block)
        self._push(block)

    def add_many(self, blocks: list[int]) -> None:
        for block in blocks:
            self.add(block)

    def restore(self, block: int) -> None:
        self._push(block)

    def remove(self, block: int) -> None:
        self._entry.pop(block, None)

    def touch(self, block: int) -> None:
        self._tick += 1
        self._use(block)
        if block in self._entry:
            self._push(block)

    def pop_victim(self) -> int:
        while self._heap:
            entry = heapq.heappop(self._heap)
            block = entry[-1]
            if self._entry.get(block) == entry[-2]:
                del self._entry[block]
                self._forget(block)
                return block
        raise KeyError("no evictable block")

    def pop_victims(self, k: int) -> list[int]:
        return [self.pop_victim() for _ in range(k)]

    def __len__(self) -> int:
        return len(self._entry)

    def __contains__(self, block: int) -> bool:
        return block in self._entry

    def ids(self) -> np.ndarray:
        live = sorted(e for e in self._heap if self._entry.get(e[-1]) == e[-2])
        return np.array([e[-1] for e in live], dtype=np.int32)


class LRUPolicy:
    """Least recently used first. With a freed request's blocks added tail first (what
    `PrefixIndex.release` does), its last block is evicted before its earlier ones: vLLM v1's
    free-block queue order.

    Every use takes the clock's next tick, so the block used last always goes to the back: the evictable
    blocks are kept in an ordered dict, least recent first (vLLM's doubly linked free queue), O(1) per
    operation. `restore` (a tree's parent becoming a leaf with an old last use) is the one insertion
    that is not at the back; it re-sorts (O(n)), and no flat index calls it."""

    wants_depth = False

    def __init__(self) -> None:
        self._queue: OrderedDict[int, None] = OrderedDict()  # evictable blocks, least recent first
        self._last: dict[int, int] = {}  # registered block -> tick of its last use
        self._tick = 0

    def set_depth(self, block: int, depth: int) -> None:
        del block, depth

    def add(self, block: int) -> None:
        self._tick += 1
        self._last[block] = self._tick
        self._queue[block] = None

    def add_many(self, blocks: list[int]) -> None:
        tick = self._tick
        self._last.update(zip(blocks, range(tick + 1, tick + 1 + len(blocks)), strict=True))
        self._tick = tick + len(blocks)
        self._queue.update(dict.fromkeys(blocks))

    def restore(self, block: int) -> None:
        last = self._last
        self._queue = OrderedDict.fromkeys(sorted([*self._queue, block], key=last.__getitem__))

    def remove(self, block: int) -> None:
        self._queue.pop(block, None)

    def touch(self, block: int) -> None:
        self._tick += 1
        self._last[block] = self._tick
        if block in self._queue:
            self._queue.move_to_end(block)

    def pop_victim(self) -> int:
        if not self._queue:
            raise KeyError("no evictable block")
        block = self._queue.popitem(last=False)[0]
        del self._last[block]
        return block

    def pop_victims(self, k: int) -> list[int]:
        pop, last = self._queue.popitem, self._last
        victims = [pop(last=False)[0] for _ in range(k)]
        for block in victims:
            del last[block]
        return victims

    def __len__(self) -> int:
        return len(self._queue)

    def __contains__(self, block: int) -> bool:
        return block in self._queue

    def ids(self) -> np.ndarray:
        return np.fromiter(self._queue, dtype=np.int32, count=len(self._queue))


class FIFOPolicy(HeapPolicy):
    """First in, first out: ordered by a block's first use since it was registered; hits do not
    reorder it."""

    def __init__(self) -> None:
        super().__init__()
        self._first: dict[int, int] = {}  # block -> tick of its first use

    def _use(self, block: int) -> None:
        self._first.setdefault(block, self._tick)

    def _priority(self, block: int) -> tuple:
        return (self._first[block],)

    def _forget(self, block: int) -> None:
        del self._first[block]


class LFUPolicy(HeapPolicy):
    """Least frequently used first (uses since registration), ties least recently used first."""

    def __init__(self) -> None:
        super().__init__()
        self._uses: dict[int, int] = {}
        self._last: dict[int, int] = {}

    def _use(self, block: int) -> None:
        self._uses[block] = self._uses.get(block, 0) + 1
        self._last[block] = self._tick

    def _priority(self, block: int) -> tuple:
        return (self._uses[block], self._last[block])

    def _forget(self, block: int) -> None:
        del self._uses[block], self._last[block]


class DepthPolicy(HeapPolicy):
    """Deepest prefix position first, ties least recently used: what a trace with a shared head
    (a system prompt, a conversation's early turns) knows, that deeper blocks are reused by fewer
    requests. The index tells the depth (`set_depth`, 0 for a prompt's first block) at registration."""

    wants_depth = True

    def __init__(self) -> None:
        super().__init__()
        self._depth: dict[int, int] = {}
        self._last: dict[int, int] = {}

    def set_depth(self, block: int, depth: int) -> None:
        self._depth[block] = depth

    def _use(self, block: int) -> None:
        self._last[block] = self._tick

    def _priority(self, block: int) -> tuple:
        return (-self._depth.get(block, 0), self._last[block])

    def _forget(self, block: int) -> None:
        self._depth.pop(block, None)
        del self._last[block]


POLICIES = {"lru": LRUPolicy, "fifo": FIFOPolicy, "lfu": LFUPolicy, "depth": DepthPolicy}


def make_policy(name: str) -> EvictionPolicy:
    """A fresh policy by its `--eviction` name."""
    if name not in POLICIES:
        raise ValueError(f"unknown eviction policy {name!r}; valid: {', '.join(POLICIES)}")
    return POLICIES[name]()
