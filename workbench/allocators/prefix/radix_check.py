"""The invariants of `prefix.radix_index`, recomputed from the nodes and the strategy's blocks.

Block by block, as the tree's definition has them: every registered block sits in exactly one node, filed
under its key, and no key twice; a node's blocks are a chain (each the only child of the one before) and
its child nodes hang under its tail; a block is locked iff a sequence holds it or anything below it, and
the locked blocks of a node are a leading part (`locked`); evictable = registered and unlocked, counted
right; the heap holds exactly the nodes whose tail is an evictable leaf, each at its tail's current
priority.
"""

from __future__ import annotations

import numpy as np


def check_radix(index, refcount: np.ndarray, free_block_ids: np.ndarray) -> None:
    """Raise AssertionError naming the first broken invariant. Pure. The per-block invariants are checked
    over every node's blocks at once (the tests run this after every operation of their walks)."""
    root, nodes = index._root, index._nodes
    for node_id, node in nodes.items():
        if node.node_id != node_id or node.n < 1:
            raise AssertionError(f"radix index: node {node_id} is empty or filed under another id")
        parent = node.parent
        if parent is None or parent.children.get(node.first_key()) is not node:
            raise AssertionError(f"radix index: node {node_id} is not its parent's child under its first key")
        if node.depth != (0 if parent is root else parent.depth + parent.n):
            raise AssertionError(f"radix index: node {node_id} starts at depth {node.depth}, not below its parent")
    in_order = list(nodes.values())
    deepest_held = _check_blocks(index, in_order, refcount, free_block_ids)
    seen = sum(node.n for node in in_order)
    evictable = 0
    for node, deepest in zip(in_order, deepest_held.tolist(), strict=True):
        node_id = node.node_id
        locked_children = sum(child.locked > 0 for child in node.children.values())
        if locked_children != node.locked_children:
            raise AssertionError(f"radix index: node {node_id} counts {node.locked_children} locked children, "
                                 f"has {locked_children}")
        if node.locked != (node.n if locked_children else deepest):
            raise AssertionError(f"radix index: node {node_id} has {node.locked} locked blocks, its holders and "
                                 f"children lock {node.n if locked_children else deepest}")
        evictable += node.n - node.locked
        if bool(node.entry) != node.is_candidate():
            raise AssertionError(f"radix index: node {node_id} has a heap entry {node.entry}, its tail is "
                                 f"{'' if node.is_candidate() else 'not '}an evictable leaf")
    if seen != index._num_registered:
        raise AssertionError(f"radix index: {index._num_registered} blocks counted registered, {seen} in nodes")
    registered = index.registered_block_ids()
    if np.unique(index._key_of[registered]).shape[0] != seen:
        raise AssertionError("radix index: two registered blocks share a key (a prefix cached twice)")
    if evictable != index._num_evictable:
        raise AssertionError(f"radix index: {index._num_evictable} evictable counted, {evictable} in the nodes")
    live = [e for e in index._heap if e[-1].entry == e[-2]]
    if len(live) != index._num_entries or len({id(e[-1]) for e in live}) != len(live):
        raise AssertionError("radix index: the heap's live entries disagree with the nodes' entries")
    for entry in live:
        node = entry[-1]
        if nodes.get(node.node_id) is not node or entry[:-2] != index._stats.priority(node.tail()):
            raise AssertionError(f"radix index: node {node.node_id} is in the heap at a stale priority or "
                                 "is gone")
    if index._node_of.shape[0] and np.count_nonzero(index._node_of >= 0) != seen:
        raise AssertionError("radix index: a block points at a node that does not hold it")
    _check_root(root)


def _check_root(root) -> None:
    if root.parent is not None or root.n != 0:
        raise AssertionError("radix index: the root holds blocks or has a parent")
    for child in root.children.values():
        if child.parent is not root:
            raise AssertionError(f"radix index: node {child.node_id} hangs under the root, points elsewhere")


def _check_blocks(index, in_order: list, refcount: np.ndarray, free_block_ids: np.ndarray) -> np.ndarray:
    """The invariants of each node's blocks, over all nodes' blocks laid end to end: filed under their keys,
    off the free stack, pointing back at their node and place, held as their refcounts say. Returns each
    node's deepest held block + 1 (0: none held), int64 [len(in_order)]."""
    if not in_order:
        return np.zeros(0, dtype=np.int64)
    sizes = np.array([node.n for node in in_order], dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    owner = np.repeat(np.arange(len(in_order)), sizes)  # each block's node, by its place in in_order
    place = np.arange(owner.shape[0]) - starts[owner]  # each block's place in its node
    node_ids = np.array([node.node_id for node in in_order], dtype=np.int64)
    blocks = np.concatenate([node.blocks[:node.n] for node in in_order])
    keys = np.concatenate([node.keys[:node.n] for node in in_order])

    def require(ok: np.ndarray, what: str) -> None:
        if not ok.all():
            raise AssertionError(f"radix index: {what.format(int(node_ids[owner[np.argmin(ok)]]))}")

    require(index._key_of[blocks] == keys, "the blocks of node {} are filed under other keys")
    free = np.zeros(refcount.shape[0], dtype=bool)
    free[free_block_ids] = True
    require(~free[blocks], "a registered block of node {} is on the free stack")
    require((index._node_of[blocks] == node_ids[owner]) & (index._pos[blocks] == place),
            "the blocks of node {} do not point back at it")
    held = index._held[blocks]
    require(held == (refcount[blocks] > 0), "node {}'s held blocks disagree with their refcounts")
    return np.maximum.reduceat(np.where(held, place + 1, 0), starts)
