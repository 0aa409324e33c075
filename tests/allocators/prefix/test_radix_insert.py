"""`RadixPrefixIndex.insert` of a batch decides it as if its entries were inserted one at a time, in order.

The index registers a prompt's chain of new blocks a run at a time, and any other batch entry by entry with what
the decisions read about the parents gathered once; both must keep to the decisions of one entry at a time.
Random batches over random trees (chains of shared heads, so that nodes split and hang children), with entries
that continue a node's tail, share a parent, start below the root, repeat a key under one parent, hold an evicted
or unregistered parent, repeat a block or name another entry's block as their parent, and chains of a prompt's
new blocks, must leave the tree exactly as the entries inserted one by one do, each block in one place."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from workbench.allocators.prefix.radix_index import RadixPrefixIndex


def _state(index: RadixPrefixIndex):
    nodes = {node_id: (node.blocks[:node.n].tolist(), node.keys[:node.n].tolist(), node.depth, node.locked,
                       node.locked_children, sorted(node.children), node.parent.node_id)
             for node_id, node in index._nodes.items()}
    registered = np.flatnonzero(index._node_of >= 0)
    blocks = {int(b): (int(index._node_of[b]), int(index._pos[b]), int(index._key_of[b]),
                       int(index._stats.depth[b]) if hasattr(index._stats, "depth") else None)
              for b in registered}
    return (nodes, sorted(index._root.children), blocks, np.flatnonzero(index._held).tolist(),
            index._num_registered, index._num_evictable, index._next_node)


def _grow_tree(rng, index: RadixPrefixIndex, num_chains: int) -> tuple[list[np.ndarray], int]:
    """Sequences' prompts inserted as `_chain`s, so that prompts share heads and nodes split and hang children;
    returns the chains below the root (each a whole table) and the next unused block id."""
    next_block, tables = 0, []
    for _ in range(num_chains):
        parents, keys, blocks, before = _chain(rng, index, np.flatnonzero(index._node_of >= 0).tolist(), next_block)
        index.insert(parents, keys, blocks, before)
        next_block += blocks.shape[0]
        if before[0] < 0:
            tables.append(blocks)
    return tables, next_block


def _batch(rng, index: RadixPrefixIndex, registered: list[int], next_block: int, apart: bool):
    size = int(rng.integers(1, 8))
    parent_blocks, parent_keys, keys, blocks = [], [], [], []
    for i in range(size):
        kind = rng.random()
        if kind < 0.15 or not registered:
            before, parent_key = -1, 0
        elif kind < 0.25 and not apart and blocks:
            before = blocks[int(rng.integers(len(blocks)))]  # another entry's block
            parent_key = int(keys[blocks.index(before)])
        else:
            before = registered[int(rng.integers(len(registered)))]
            parent_key = int(index._key_of[before]) if rng.random() < 0.9 else 12345  # else: not its key
        parent_blocks.append(before)
        parent_keys.append(parent_key)
        keys.append(int(rng.integers(1, 5)) * 1000 + parent_key % 1000)  # few keys per parent: some repeat
        blocks.append(blocks[int(rng.integers(len(blocks)))] if not apart and blocks and rng.random() < 0.1
                      else next_block + i)
    return (np.array(parent_keys, dtype=np.uint64), np.array(keys, dtype=np.uint64),
            np.array(blocks, dtype=np.int32), np.array(parent_blocks, dtype=np.int32))


def _chain(rng, index: RadixPrefixIndex, registered: list[int], next_block: int):
    """A prompt's new blocks as one chain (each one's parent the block before), below a registered block or the
    root, under keys from a small alphabet: some are cached already under their parent (a copy), which ends a
    run of registrations; the prompt may also hold an unregistered copy of its first parent."""
    length = int(rng.integers(2, 7))
    if registered and rng.random() < 0.7:
        first_before = registered[int(rng.integers(len(registered)))]
        first_parent = int(index._key_of[first_before]) if rng.random() < 0.9 else 12345
    else:
        first_before, first_parent = -1, 0
    keys = (first_parent + rng.integers(1, 4, length).astype(np.uint64).cumsum() * 7).astype(np.uint64)
    blocks = np.arange(next_block, next_block + length, dtype=np.int32)
    parents = np.concatenate([[first_parent], keys[:-1]]).astype(np.uint64)
    before = np.concatenate([[first_before], blocks[:-1]]).astype(np.int32)
    return parents, keys, blocks, before


@pytest.mark.parametrize("eviction", ["lru", "depth"])
@pytest.mark.parametrize("shape", ["apart", "any", "chain"])
def test_a_batch_inserts_as_its_entries_one_at_a_time(eviction, shape):
    rng = np.random.default_rng(7)
    for _ in range(300):
        index = RadixPrefixIndex(eviction)
        tables, next_block = _grow_tree(rng, index, int(rng.integers(1, 6)))
        for table in tables[:int(rng.integers(len(tables) + 1))]:  # some sequences end: their blocks unlock
            index.release(table)
        registered = np.flatnonzero(index._node_of >= 0).tolist()
        parent_keys, keys, blocks, parent_blocks = (
            _chain(rng, index, registered, next_block) if shape == "chain"
            else _batch(rng, index, registered, next_block, apart=shape == "apart"))
        one_by_one = copy.deepcopy(index)
        index.insert(parent_keys, keys, blocks, parent_blocks)
        for i in range(blocks.shape[0]):
            one_by_one.insert(parent_keys[i:i + 1], keys[i:i + 1], blocks[i:i + 1], parent_blocks[i:i + 1])
        assert _state(index) == _state(one_by_one)
        in_nodes = [b for node in index._nodes.values() for b in node.blocks[:node.n].tolist()]
        assert sorted(in_nodes) == np.flatnonzero(index._node_of >= 0).tolist(), "a block registered twice"
