"""A radix tree over pages: the prefix index of `radix` (SGLang's RadixAttention, `RadixCache`).

SGLang keeps the KV of every cached token sequence in a radix tree whose edges split at any page
(`page_size` tokens; 1 = token granular); a prompt matches the longest cached path from the root;
a running request locks its path (`inc_lock_ref`: the lock counts on every node up to the root) so
that it cannot be evicted; eviction removes unlocked *leaves* by priority, so an inner node goes
only once its whole subtree has gone, and a cached path never loses its head before its tail.

Here a page is one block (`--block-size`, ≥ 1), named by its chain key (which names the whole prefix).
A node (`prefix.radix_node`) holds a run of blocks, a compressed edge: it splits where prompts diverge
and grows while a sequence fills blocks below its tail, so matching, locking and releasing cost per
node, not per block. What a block sees is defined block by block, as SGLang at `page_size` 1:
- `insert` registers only new prefixes (a key already cached keeps its block: the recomputed copy
  stays unregistered and is freed with its request, as SGLang frees the duplicate KV of
  `cache_finished_req`), and only under the registered block that its sequence really holds (a block
  after a copy, or after an evicted prefix, has no path from the root: it stays unregistered; SGLang
  would swap the request onto the tree's node, which an append-only block table cannot).
- A block is *locked* while a sequence holds it or anything below it; evictable = registered and
  unlocked. Eviction takes evictable *leaf* blocks, smallest priority first (`prefix.block_stats`:
  the statistics of `--eviction`); evicting a leaf may make its parent a leaf, ordered by its
  recorded statistics, as SGLang pushes the parent onto its heap with its own last-access time.
- Uses: a hit uses every block of its path, head first (SGLang updates last_access_time on match); a
  release uses every block it unlocks, tail first (so a request's tail is older than its head).
The heap holds one entry per leaf node, its tail's priority; a run of a node's blocks whose priorities
all come before the next leaf's is evicted at once, which is the order one block at a time would take.
"""

from __future__ import annotations

import copy
import heapq

import numpy as np

from workbench.allocators.id_bound import id_bound
from workbench.allocators.prefix.block_stats import make_block_stats
from workbench.allocators.prefix.radix_check import check_radix
from workbench.allocators.prefix.radix_node import RadixNode

_NO_BLOCKS = np.zeros(0, dtype=np.int32)


def _holds(parent_key: int, before: int, node_id: int, registered_key: int) -> bool:
    """Pure. Whether the block registered under `parent_key` (-1: the root, for key 0) is `before`, the block its
    sequence holds there (`node_id`, `registered_key`: its node, -1 when unregistered, and its key): else no path
    from the root reaches the block after it (its parent prefix was evicted, or the sequence holds an
    unregistered copy of it)."""
    if parent_key == 0:
        return before == -1
    return before >= 0 and node_id >= 0 and registered_key == parent_key


class RadixPrefixIndex:
    def __init__(self, eviction: str = "lru") -> None:
        self._stats = make_block_stats(eviction)
        self._root = RadixNode(-1, _NO_BLOCKS, np.zeros(0, dtype=np.uint64), -1, None)
        self._nodes: dict[int, RadixNode] = {}  # node id -> node (the root is not one)
        self._next_node = 0
        self._node_of = np.full(0, -1, dtype=np.int64)  # [num_blocks] node id of a registered block, -1: none
        self._pos = np.zeros(0, dtype=np.int64)  # [num_blocks] a registered block's place in its node
        self._held = np.zeros(0, dtype=bool)  # [num_blocks] registered and held by a sequence (refcount > 0)
        self._key_of = np.zeros(0, dtype=np.uint64)  # [num_blocks] a registered block's chain key
        self._num_registered = 0
        self._num_evictable = 0
        self._heap: list[tuple] = []  # (*priority, entry number, node); stale entries skipped lazily
        self._num_entries = 0  # live heap entries
        self._next_entry = 0

    # -- queries -----------------------------------------------------------------------------------

    def lookup(self, keys: np.ndarray, max_blocks: int) -> np.ndarray:
        parts = [node.blocks[:matched] for node, matched in self._walk(keys, max_blocks)]
        return np.concatenate(parts) if parts else _NO_BLOCKS

    def tree_path(self, keys: np.ndarray, max_blocks: int) -> tuple[tuple[int, int], ...]:
        return tuple((node.node_id, matched) for node, matched in self._walk(keys, max_blocks))

    def _walk(self, keys: np.ndarray, max_blocks: int) -> list[tuple[RadixNode, int]]:
        """Pure. Down from the root, one node at a time (its blocks' keys compared with the prompt's at once): the
        nodes the leading run of `keys`, at most `max_blocks` of them, runs through and their blocks matched."""
        node, pos, num_keys = self._root, 0, min(max_blocks, keys.shape[0])
        path = []
        while pos < num_keys:
            child = node.children.get(int(keys[pos]))
            if child is None:
                break
            span = min(child.n, num_keys - pos)
            same = child.keys[:span] == keys[pos:pos + span]
            matched = span if same.all() else int(same.argmin())
            path.append((child, matched))
            pos += matched
            if matched < child.n:
                break
            node = child
        return path

    def num_evictable(self) -> int:
        return self._num_evictable

    def evictable_block_ids(self) -> np.ndarray:
        """The evictable blocks in the order repeated `evict(1)` would take them (simulated on a copy:
        for checks and tests). Pure."""
        return copy.deepcopy(self).evict(self._num_evictable)

    def evictable_block_set(self) -> np.ndarray:
        parts = [node.blocks[node.locked:node.n] for node in self._nodes.values() if node.locked < node.n]
        return np.concatenate(parts) if parts else _NO_BLOCKS

    def registered_under(self, block: int, key: int) -> bool:
        return block < self._node_of.shape[0] and self._node_of[block] >= 0 and int(self._key_of[block]) == key

    def registered_block_ids(self) -> np.ndarray:
        parts = [node.blocks[:node.n] for node in self._nodes.values()]
        return np.concatenate(parts) if parts else _NO_BLOCKS

    # -- registration --------------------------------------------------------------------------------

    def insert(self, parent_keys: np.ndarray, keys: np.ndarray, blocks: np.ndarray,
               parent_blocks: np.ndarray) -> None:
        """A key names its prefix, so a key is registered only as the child of its parent key's block: the
        tree answers "is this key cached" without a table of every key."""
        if blocks.shape[0] == 0:
            return
        self._fit(max(id_bound(blocks), id_bound(parent_blocks)))  # a parent block may lie past every block here
        if blocks.shape[0] > 1 and np.array_equal(parent_keys[1:], keys[:-1]) and \
                np.array_equal(parent_blocks[1:], blocks[:-1]):
            self._insert_chain(parent_keys, keys, blocks, parent_blocks)
            return
        self._insert_entries(parent_keys, keys, blocks, parent_blocks)

    def _insert_entries(self, parent_keys: np.ndarray, keys: np.ndarray, blocks: np.ndarray,
                        parent_blocks: np.ndarray) -> None:
        """`insert` entry by entry, in order (a decode step's filled blocks, each below its own sequence's last
        block), with what the decisions read about the parents gathered once. An earlier entry changes what a
        later one read only where it registers the later one's parent (so a parent found unheld is looked at
        again) or changes the later one's parent node: it splits it (the blocks past the split leave, and it
        gains a child), continues it or hangs a child under it. After any of these the later entry's recorded
        place is no longer a childless tail, so the fast case (continue the parent's node, as `_attach_one`
        would) applies only where nothing changed, and every other entry takes `_child` and `_attach_one`."""
        safe = np.maximum(parent_blocks, 0)
        node_ids, positions = self._node_of[safe].tolist(), self._pos[safe].tolist()
        registered_keys = self._key_of[safe].tolist()
        nodes = self._nodes
        for i, (parent_key, key, block, before) in enumerate(zip(parent_keys.tolist(), keys.tolist(),
                                                                 blocks.tolist(), parent_blocks.tolist(), strict=True)):
            if self._node_of[block] >= 0:
                continue  # registered already: its key is cached, or an earlier entry named the same block
            if not (_holds(parent_key, before, node_ids[i], registered_keys[i])
                    or self._holds_parent(parent_key, before)):
                continue
            if before >= 0 and node_ids[i] >= 0:
                parent = nodes[node_ids[i]]
                if positions[i] == parent.n - 1 and not parent.children:  # no split, and no child to find
                    self._continue(parent, key, block)
                    continue
            if self._child(before, key) < 0:
                self._attach_one(before, key, block)

    def _holds_parent(self, parent_key: int, before: int) -> bool:
        """Pure. `_holds` with the parent block's registration read now."""
        if before < 0:
            return _holds(parent_key, before, -1, 0)
        return _holds(parent_key, before, int(self._node_of[before]), int(self._key_of[before]))

    def _child(self, parent_block: int, key: int) -> int:
        """Pure. The registered block under `parent_block` (-1: the root) keyed `key`, -1 when none: the key
        is cached already, so the block being inserted is a copy and stays unregistered."""
        if parent_block < 0:
            node = self._root.children.get(key)
            return -1 if node is None else int(node.blocks[0])
        node, pos = self._nodes[int(self._node_of[parent_block])], int(self._pos[parent_block])
        if pos < node.n - 1:
            return int(node.blocks[pos + 1]) if int(node.keys[pos + 1]) == key else -1
        child = node.children.get(key)
        return -1 if child is None else int(child.blocks[0])

    def _insert_chain(self, parent_keys: np.ndarray, keys: np.ndarray, blocks: np.ndarray,
                      parent_blocks: np.ndarray) -> None:
        """`insert` of consecutive blocks of one sequence (each one's parent is the one before), decided a
        run at a time: a run of unregistered blocks starts where its parent is registered under its own key
        (or is the call's own parent, held) and its first key is new; it ends at the next registered block
        (a new block has no child, so the keys after a run's first are new)."""
        registered = self._node_of[blocks] >= 0
        starts = np.flatnonzero(registered[:-1] & (self._key_of[blocks[:-1]] == keys[:-1])) + 1
        if self._holds_parent(int(parent_keys[0]), int(parent_blocks[0])):
            starts = np.concatenate([[0], starts])
        taken = np.flatnonzero(registered)
        for begin in starts.tolist():
            parent = int(parent_blocks[begin])
            if registered[begin] or self._child(parent, int(keys[begin])) >= 0:
                continue
            after = np.searchsorted(taken, begin)
            end = int(taken[after]) if after < taken.shape[0] else blocks.shape[0]
            self._attach(parent, keys[begin:end], blocks[begin:end])

    def _attach(self, parent_block: int, keys: np.ndarray, blocks: np.ndarray) -> None:
        """Mutates. Register a run of new blocks (held by the sequence that filled them) below `parent_block`
        (-1: the root), which that sequence holds: continue its node when it is the tail of a node with no
        children, else start a child node (splitting the parent's node below it)."""
        self._key_of[blocks] = keys
        self._held[blocks] = True
        self._num_registered += blocks.shape[0]
        parent, depth = self._parent_below(parent_block)
        self._stats.set_depth(blocks, np.arange(depth, depth + blocks.shape[0]))
        if parent is not self._root and not parent.children:
            self._node_of[blocks] = parent.node_id
            self._pos[blocks] = np.arange(parent.n, parent.n + blocks.shape[0])
            parent.append(blocks, keys)
            parent.locked = parent.n  # the new tail is held
            return
        node = self._new_node(blocks, keys, depth, parent)
        node.locked = node.n
        parent.children[node.first_key()] = node
        parent.locked_children += 1  # the parent's tail is held: locked already, and no leaf of the order

    def _attach_one(self, parent_block: int, key: int, block: int) -> None:
        """`_attach` of one block (a decode step fills one per sequence), continuing the parent's node in scalar
        stores; a new node takes `_attach` itself."""
        parent, _ = self._parent_below(parent_block)
        if parent is self._root or parent.children:
            self._attach(parent_block, np.array([key], dtype=np.uint64), np.array([block], dtype=np.int32))
            return
        self._continue(parent, key, block)

    def _continue(self, parent: RadixNode, key: int, block: int) -> None:
        """Mutates. `block`, new and held by the sequence that filled it, continues `parent` (a node whose tail that
        sequence holds and which has no child node) in scalar stores."""
        self._key_of[block] = key
        self._held[block] = True
        self._num_registered += 1
        self._stats.set_depth(block, parent.depth + parent.n)
        self._node_of[block] = parent.node_id
        self._pos[block] = parent.n
        parent.append_one(block, key)
        parent.locked = parent.n  # the new tail is held

    def _parent_below(self, parent_block: int) -> tuple[RadixNode, int]:
        """Mutates. The node new blocks below `parent_block` (-1: the root) hang from or continue, and the
        prefix depth of the first of them; a parent block inside its node splits the node below it first."""
        if parent_block < 0:
            return self._root, 0
        parent = self._nodes[int(self._node_of[parent_block])]
        pos = int(self._pos[parent_block])
        if pos < parent.n - 1:
            self._split(parent, pos + 1)
        return parent, parent.depth + parent.n

    def _new_node(self, blocks: np.ndarray, keys: np.ndarray, depth: int, parent: RadixNode) -> RadixNode:
        node = RadixNode(self._next_node, blocks, keys, depth, parent)
        self._next_node += 1
        self._nodes[node.node_id] = node
        self._node_of[blocks] = node.node_id
        self._pos[blocks] = np.arange(blocks.shape[0])
        return node

    def _split(self, node: RadixNode, at: int) -> None:
        """Mutates. Blocks [at, n) of `node` move to a new node, its only child; nothing else changes."""
        below = self._new_node(node.blocks[at:node.n], node.keys[at:node.n], node.depth + at, node)
        below.children, below.locked_children = node.children, node.locked_children
        for child in below.children.values():
            child.parent = below
        below.locked = max(0, node.locked - at)
        node.locked = min(node.locked, at)
        node.children = {below.first_key(): below}
        node.locked_children = int(below.locked > 0)
        node.n = at
        if node.entry:  # its tail moved: the leaf is the new node now, with the same priority
            node.entry = 0
            self._num_entries -= 1
            self._push(below)

    # -- holders ---------------------------------------------------------------------------------------

    def claim(self, blocks: np.ndarray) -> None:
        """`blocks` is a path from the root (a `lookup` result), head first."""
        if blocks.shape[0] == 0:
            return
        self._stats.use(blocks)  # a hit is a use, head first
        self._held[blocks] = True
        last = int(blocks[-1])
        node, cover = self._nodes[int(self._node_of[last])], int(self._pos[last]) + 1
        while node is not self._root and cover > node.locked:
            was_locked = node.locked > 0
            self._num_evictable -= cover - node.locked
            node.locked = cover
            if node.entry and node.locked == node.n:
                self._drop_entry(node)
            if was_locked:
                break  # its ancestors were locked already
            node = node.parent
            node.locked_children += 1
            cover = node.n

    def release(self, blocks: np.ndarray) -> np.ndarray:
        if blocks.shape[0] == 0:
            return blocks
        self._fit(id_bound(blocks))
        registered = self._node_of[blocks] >= 0
        mine = blocks[registered]
        self._held[mine] = False
        node_ids = self._node_of[mine]
        positions = self._pos[mine]
        # tail first, one node's run at a time: the deepest block still locked but no longer held starts a
        # walk up (`_unlock`); blocks the walk passes, or that stay locked, start nothing
        end = mine.shape[0]
        while end > 0:
            node_id = node_ids[end - 1]
            begin = end - 1
            while begin > 0 and node_ids[begin - 1] == node_id:
                begin -= 1
            node = self._nodes[int(node_id)]
            run = positions[begin:end]
            locked_now = self._locked_length(node)
            starts = run[(run < node.locked) & (run >= locked_now)]
            if starts.shape[0]:
                self._unlock(node, int(starts.max()), locked_now)
            end = begin
        return blocks[~registered]

    def _locked_length(self, node: RadixNode) -> int:
        """Pure. How many leading blocks of `node` are locked by its holders and child nodes now (the blocks
        held lie within its locked part)."""
        if node.locked_children:
            return node.n
        held = self._held[node.blocks[:node.locked]]
        return node.locked - int(held[::-1].argmax()) if held.any() else 0

    def _unlock(self, node: RadixNode, deepest: int, locked_now: int) -> None:
        """Mutates. Blocks [locked_now, deepest] of `node` were locked and are not any more: each is used,
        deepest first, and becomes evictable; when the whole node is, its parent's tail may follow."""
        while True:
            if deepest + 1 != node.locked:
                raise AssertionError(f"radix index: node {node.node_id} unlocks blocks up to {deepest}, "
                                     f"its locked part ends at {node.locked}")
            self._stats.use(node.blocks[locked_now:deepest + 1][::-1])
            self._num_evictable += node.locked - locked_now
            node.locked = locked_now
            if not node.children:
                self._push(node)  # its tail is a leaf now
            parent = node.parent
            if locked_now or parent is self._root:
                return
            parent.locked_children -= 1
            if parent.locked_children or self._held[parent.blocks[parent.n - 1]]:
                return
            node, deepest = parent, parent.n - 1
            locked_now = self._locked_length(node)

    # -- eviction ------------------------------------------------------------------------------------

    def evict(self, k: int) -> np.ndarray:
        return self.evict_keyed(k)[0]

    def evict_keyed(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        if k > self._num_evictable:
            raise RuntimeError(f"cannot evict {k} blocks: {self._num_evictable} evictable")
        blocks, keys = [], []
        left = k
        while left:
            node = self._pop_leaf()
            run = node.blocks[max(node.locked, node.n - left):node.n][::-1]  # its evictable tail, tail first
            nxt = self._top_priority()
            # the tail is the smallest; the blocks above it follow while they precede the next leaf
            if nxt is None:
                taken = run.shape[0]
            else:  # up to the first block above the tail that does not precede the next leaf
                precedes = self._stats.precede(run[1:], nxt)
                taken = 1 + (precedes.shape[0] if precedes.all() else int(precedes.argmin()))
            blocks.append(run[:taken])
            keys.append(node.keys[node.n - taken:node.n][::-1])
            self._unregister(node, taken)
            left -= taken
        if not blocks:
            return _NO_BLOCKS, np.zeros(0, dtype=np.uint64)
        return np.concatenate(blocks), np.concatenate(keys)

    def _unregister(self, node: RadixNode, k: int) -> None:
        """Mutates. The last k blocks of `node` (evictable, tail first, out of the heap) are evicted."""
        gone = node.blocks[node.n - k:node.n]
        self._node_of[gone] = -1
        self._num_registered -= k
        self._stats.forget(gone)
        node.n -= k
        self._num_evictable -= k
        if node.locked < node.n:
            self._push(node)
            return
        if node.n:
            return  # what is left is locked
        parent = node.parent
        del parent.children[node.first_key()], self._nodes[node.node_id]
        if parent is not self._root and parent.is_candidate():
            self._push(parent)  # a leaf now, ordered by its recorded statistics

    def _push(self, node: RadixNode) -> None:
        if not node.entry:
            self._num_entries += 1
        self._next_entry += 1
        node.entry = self._next_entry
        heapq.heappush(self._heap, (*self._stats.priority(node.tail()), self._next_entry, node))
        if len(self._heap) > 2 * self._num_entries + 64:
            self._heap = [e for e in self._heap if e[-1].entry == e[-2]]
            heapq.heapify(self._heap)

    def _drop_entry(self, node: RadixNode) -> None:
        node.entry = 0
        self._num_entries -= 1

    def _pop_leaf(self) -> RadixNode:
        while True:
            entry = heapq.heappop(self._heap)
            node = entry[-1]
            if node.entry == entry[-2]:
                self._drop_entry(node)
                return node

    def _top_priority(self) -> tuple | None:
        """The next leaf's priority (stale entries dropped), None when none is left."""
        heap = self._heap
        while heap and heap[0][-1].entry != heap[0][-2]:
            heapq.heappop(heap)
        return heap[0][:-2] if heap else None

    # -- storage and checks -----------------------------------------------------------------------------

    def _fit(self, num_blocks: int) -> None:
        """Mutates. Room for block ids below `num_blocks` in the per-block arrays."""
        size = self._node_of.shape[0]
        if num_blocks <= size:
            return
        grow = max(num_blocks, 2 * size) - size
        self._node_of = np.concatenate([self._node_of, np.full(grow, -1, dtype=np.int64)])
        self._pos = np.concatenate([self._pos, np.zeros(grow, dtype=np.int64)])
        self._held = np.concatenate([self._held, np.zeros(grow, dtype=bool)])
        self._key_of = np.concatenate([self._key_of, np.zeros(grow, dtype=np.uint64)])
        self._stats.fit(size + grow)

    def check_integrity(self, refcount: np.ndarray, free_block_ids: np.ndarray) -> None:
        check_radix(self, refcount, free_block_ids)
