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
same order in a linked list over block ids (a use always moves a block to the back). Priorities use a logical clock
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
from typing import Protocol

import numpy as np

from workbench.allocators.id_bound import id_bound
from workbench.allocators.prefix import lru_list


class EvictionPolicy(Protocol):
    def add(self, block: int) -> None:
        """Mutates. `block` becomes evictable (it is not in the set); this counts as a use."""
        ...

    def add_many(self, blocks: np.ndarray) -> None:
        """Mutates. `add` each of `blocks` (distinct, int32), in order."""
        ...

    def claim_many(self, blocks: np.ndarray) -> None:
        """Mutates. Each of `blocks` (int32) is hit, in order: `remove` then `touch`."""
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

    def pop_victims(self, k: int) -> np.ndarray:
        """Mutates. `pop_victim` k times (k <= len), the victims in order, int32 [k]."""
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

    def add_many(self, blocks: np.ndarray) -> None:
        for block in np.asarray(blocks).tolist():
            self.add(block)

    def claim_many(self, blocks: np.ndarray) -> None:
        for block in blocks.tolist():
            self.remove(block)
            self.touch(block)

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

    def pop_victims(self, k: int) -> np.ndarray:
        return np.array([self.pop_victim() for _ in range(k)], dtype=np.int32)

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
    blocks are kept in a doubly linked list over block ids, least recent first (vLLM's free queue), O(1)
    per block, in arrays under compiled loops (`lru_list`). `restore` (a tree's parent becoming a leaf
    with an old last use) is the one insertion that is not at the back; it walks to its place (O(n)), and
    no flat index calls it. The batch calls (`add_many`, `claim_many`, `pop_victims`) take and give
    int32 arrays."""

    wants_depth = False

    def __init__(self) -> None:
        self._prev = np.zeros(0, dtype=np.int32)  # [num_blocks] the block used just before, -1: the head
        self._next = np.zeros(0, dtype=np.int32)  # [num_blocks] the block used just after, -1: the tail
        self._queued = np.zeros(0, dtype=bool)  # [num_blocks] evictable
        self._last = np.zeros(0, dtype=np.int64)  # [num_blocks] tick of the last use while registered, 0: none
        self._ends = lru_list.empty_ends()  # head, tail, length, tick

    def set_depth(self, block: int, depth: int) -> None:
        del block, depth

    def fit(self, num_blocks: int) -> None:
        """Mutates. Room for block ids below `num_blocks` (grown by doubling)."""
        size = self._queued.shape[0]
        if num_blocks > size:
            grow = max(num_blocks, 2 * size, 64) - size
            self._prev = np.concatenate([self._prev, np.full(grow, lru_list.NONE, dtype=np.int32)])
            self._next = np.concatenate([self._next, np.full(grow, lru_list.NONE, dtype=np.int32)])
            self._queued = np.concatenate([self._queued, np.zeros(grow, dtype=bool)])
            self._last = np.concatenate([self._last, np.zeros(grow, dtype=np.int64)])

    def add(self, block: int) -> None:
        self.add_many(np.array([block], dtype=np.int32))

    def add_many(self, blocks) -> None:
        blocks = np.asarray(blocks, dtype=np.int32)
        if blocks.shape[0]:
            self.fit(id_bound(blocks))
            lru_list.add_many(self._prev, self._next, self._queued, self._last, self._ends, blocks)

    def restore(self, block: int) -> None:
        lru_list.restore(self._prev, self._next, self._queued, self._last, self._ends, block)

    def remove(self, block: int) -> None:
        if block < self._queued.shape[0]:
            lru_list.remove(self._prev, self._next, self._queued, self._ends, block)

    def touch(self, block: int) -> None:
        self.fit(block + 1)
        lru_list.touch(self._prev, self._next, self._queued, self._last, self._ends, block)

    def claim_many(self, blocks: np.ndarray) -> None:
        if blocks.shape[0]:
            self.fit(id_bound(blocks))
            lru_list.claim_many(self._prev, self._next, self._queued, self._last, self._ends, blocks)

    def pop_victim(self) -> int:
        if not len(self):
            raise KeyError("no evictable block")
        return int(self.pop_victims(1)[0])

    def pop_victims(self, k: int) -> np.ndarray:
        if k > len(self):
            raise KeyError(f"cannot pop {k} victims: {len(self)} evictable")
        victims = np.empty(k, dtype=np.int32)
        lru_list.pop_victims(self._prev, self._next, self._queued, self._last, self._ends, victims)
        return victims

    def __len__(self) -> int:
        return int(self._ends[lru_list.LENGTH])

    def compiled_view(self) -> tuple[np.ndarray, ...]:
        """(prev, next, queued, last use, ends): the arrays `lru_list`'s compiled functions take, changed in place."""
        return self._prev, self._next, self._queued, self._last, self._ends

    def __contains__(self, block: int) -> bool:
        return block < self._queued.shape[0] and bool(self._queued[block])

    def ids(self) -> np.ndarray:
        out = np.empty(len(self), dtype=np.int32)
        n = lru_list.in_order(self._next, self._ends, out)
        if n != out.shape[0] or int(self._queued.sum()) != n:
            raise AssertionError(f"LRU list: {n} blocks linked, {len(self)} counted, "
                                 f"{int(self._queued.sum())} marked evictable")
        return out


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
