"""A node of the radix tree of `prefix.radix_index`: a run of blocks along one edge (a compressed edge).

Block i of a node is the only child of block i - 1; the node's child nodes hang under its last block
(its *tail*), keyed by their first block's chain key. The first `locked` blocks are locked (a sequence
holds one of them or something below), the rest are evictable: the blocks locked in a run are always a
leading part, since a holder of a block holds every block above it.
"""

from __future__ import annotations

import numpy as np


class RadixNode:
    __slots__ = ("node_id", "blocks", "keys", "n", "depth", "parent", "children", "locked_children", "locked",
                 "entry")

    def __init__(self, node_id: int, blocks: np.ndarray, keys: np.ndarray, depth: int,
                 parent: RadixNode | None) -> None:
        """`blocks` (int32 [n]) and `keys` (uint64 [n]) are copied."""
        self.node_id = node_id
        self.n = n = blocks.shape[0]
        # copies of the run with as much room again: a decode step continues a node by a block at a time
        self.blocks = np.empty(2 * n, dtype=np.int32)  # [capacity]: the run's blocks, head first; the first n are live
        self.blocks[:n] = blocks
        self.keys = np.empty(2 * n, dtype=np.uint64)  # [capacity]: their chain keys
        self.keys[:n] = keys
        self.depth = depth  # prefix depth of the first block (0: a prompt's first block)
        self.parent = parent  # None: the root (which holds no block)
        self.children: dict[int, RadixNode] = {}  # first key -> child node
        self.locked_children = 0  # child nodes with a locked first block
        self.locked = 0  # leading blocks that are locked
        self.entry = 0  # number of its live heap entry (0: none; only leaves with an evictable tail have one)

    def first_key(self) -> int:
        return int(self.keys[0])

    def tail(self) -> int:
        return int(self.blocks[self.n - 1])

    def is_candidate(self) -> bool:
        """Its tail is an evictable leaf: the eviction order holds it."""
        return not self.children and self.locked < self.n

    def append(self, blocks: np.ndarray, keys: np.ndarray) -> None:
        """Mutates. Blocks that continue the run (its tail has no child node)."""
        k, n = blocks.shape[0], self.n
        self._reserve(n + k)
        self.blocks[n:n + k] = blocks
        self.keys[n:n + k] = keys
        self.n = n + k

    def append_one(self, block: int, key: int) -> None:
        """Mutates. `append` of one block, in scalar stores."""
        n = self.n
        self._reserve(n + 1)
        self.blocks[n] = block
        self.keys[n] = key
        self.n = n + 1

    def _reserve(self, size: int) -> None:
        """Mutates. Storage for `size` blocks, doubled when full."""
        if size > self.blocks.shape[0]:
            size = max(size, 2 * self.blocks.shape[0])
            self.blocks = np.concatenate([self.blocks[:self.n], np.empty(size - self.n, dtype=np.int32)])
            self.keys = np.concatenate([self.keys[:self.n], np.empty(size - self.n, dtype=np.uint64)])
