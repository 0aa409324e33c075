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
    """Raise AssertionError naming the first broken invariant. Pure."""
    root, nodes = index._root, index._nodes
    free = set(free_block_ids.tolist())
    seen = 0
    evictable = 0
    for node_id, node in nodes.items():
        if node.node_id != node_id or node.n < 1:
            raise AssertionError(f"radix index: node {node_id} is empty or filed under another id")
        blocks, keys = node.blocks[:node.n], node.keys[:node.n]
        parent = node.parent
        if parent is None or parent.children.get(node.first_key()) is not node:
            raise AssertionError(f"radix index: node {node_id} is not its parent's child under its first key")
        if node.depth != (0 if parent is root else parent.depth + parent.n):
            raise AssertionError(f"radix index: node {node_id} starts at depth {node.depth}, not below its parent")
        if not np.array_equal(index._key_of[blocks], keys):
            raise AssertionError(f"radix index: the blocks of node {node_id} are filed under other keys")
        if free.intersection(blocks.tolist()):
            raise AssertionError(f"radix index: a registered block of node {node_id} is on the free stack")
        if not (np.all(index._node_of[blocks] == node_id) and np.array_equal(index._pos[blocks], np.arange(node.n))):
            raise AssertionError(f"radix index: the blocks of node {node_id} do not point back at it")
        seen += node.n
        held = index._held[blocks]
        if not np.array_equal(held, refcount[blocks] > 0):
            raise AssertionError(f"radix index: node {node_id}'s held blocks disagree with their refcounts")
        locked_children = sum(child.locked > 0 for child in node.children.values())
        if locked_children != node.locked_children:
            raise AssertionError(f"radix index: node {node_id} counts {node.locked_children} locked children, "
                                 f"has {locked_children}")
        deepest_held = int(np.flatnonzero(held)[-1]) + 1 if held.any() else 0
        if node.locked != (node.n if locked_children else deepest_held):
            raise AssertionError(f"radix index: node {node_id} has {node.locked} locked blocks, its holders and "
                                 f"children lock {node.n if locked_children else deepest_held}")
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
