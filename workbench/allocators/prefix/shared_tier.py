"""The shared tier of a fleet's prefix caches (`--shared-tier-gib`, `--shared-link-gb-s`; docs/fleet.md).

One pool of KV blocks that every replica demotes to and promotes from, as Mooncake Store and LMCache's
shared backends serve a whole fleet. It sits below each replica's own tiers: device → own host tier
(if any) → shared tier. Its entries are named by the replicas' chain keys (`prefix.chains`), which are
pure functions of the tokens, so the same prefix has the same key on every replica, and the KV rows
are pure functions of the tokens too (`engine.kvpool.KVContent`): one copy serves every replica.

Unlike a replica's own host tier, the shared tier is not exclusive: a promote copies the block to the
device and leaves the entry where it is (marked recently used), so other replicas can hit it too. A
demote of a key the tier already holds only marks it used. A demote into a full pool replaces the least
recently used entry (its KV is lost).

This class is the pool's state only; each replica records its own moves through a `SharedTierPort`
(`prefix.shared_port`). The fleet steps one replica at a time and a replica's moves are executed
within its own step, so the pool needs to protect a block only within the step of the replica that
touches it: a block read by a promote or written by a demote this step is *pinned*, never chosen to
be replaced until `end_step`, so that every move of the step reads and writes the block it was decided
on, whatever the order the kernel runner executes the step's moves in.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from workbench.allocators.paged.block_stack import BlockStack
from workbench.allocators.prefix.host_tier import tier_blocks
from workbench.allocators.prefix.leading import leading_held

NOT_STORED = -1  # `store`: the key was held already (only marked used), or no block could take it


class SharedTier:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._block_of_key: OrderedDict[int, int] = OrderedDict()  # key -> block, least recent first
        self._key_of_block: dict[int, int] = {}
        self._free = BlockStack(num_blocks)
        self._pinned: set[int] = set()  # blocks read or written this step: not replaced before it ends

    def lookup(self, keys: np.ndarray) -> int:
        """Pure. How many leading `keys` (uint64 [k]) the pool holds."""
        return leading_held(keys.tolist(), self._block_of_key)

    def read(self, keys: np.ndarray) -> np.ndarray:
        """Mutates. The blocks of `keys` (uint64 [k], all held: a `lookup` run), int32 [k], about to be
        copied to a device: each entry stays, is marked used and pinned for the rest of the step."""
        index = self._block_of_key
        blocks = []
        for key in keys.tolist():
            index.move_to_end(key)
            blocks.append(index[key])
        self._pinned.update(blocks)
        return np.array(blocks, dtype=np.int32)

    def store(self, keys: np.ndarray) -> np.ndarray:
        """Mutates. Blocks for the KV of `keys` (uint64 [k]), int32 [k]: a free block, else the least
        recently used unpinned entry's (dropped); NOT_STORED where the key is held already (then it is
        only marked used) or every block is pinned. Each block returned is pinned."""
        index = self._block_of_key
        out = np.full(keys.shape[0], NOT_STORED, dtype=np.int32)
        for i, key in enumerate(keys.tolist()):
            if key in index:
                index.move_to_end(key)
                continue
            if self._free.size:
                block = int(self._free.pop(1)[0])
            else:
                victim = next((k for k, b in index.items() if b not in self._pinned), None)
                if victim is None:
                    continue
                block = index.pop(victim)
                del self._key_of_block[block]
            index[key] = block
            self._key_of_block[block] = key
            self._pinned.add(block)
            out[i] = block
        return out

    def end_step(self) -> None:
        """Mutates. The stepping replica's moves are taken: nothing is pinned any more."""
        self._pinned.clear()

    def num_used(self) -> int:
        """Blocks holding an entry. Pure."""
        return len(self._block_of_key)

    def check_integrity(self) -> None:
        """Raise AssertionError unless every block is either used by exactly one key or free. Pure."""
        used = list(self._block_of_key.values())
        states = np.concatenate([np.array(used, dtype=np.int64), self._free.ids().astype(np.int64)])
        if states.shape[0] != self.num_blocks or not np.array_equal(np.sort(states), np.arange(self.num_blocks)):
            raise AssertionError(f"shared tier: {len(used)} used + {self._free.size} free do not partition "
                                 f"{self.num_blocks} blocks exactly")
        if len(self._key_of_block) != len(used) or any(self._key_of_block.get(b) != k
                                                       for k, b in self._block_of_key.items()):
            raise AssertionError("shared tier: key and block maps disagree")


def shared_tier_for(shared_tier_gib: float, block_size: int, geometry) -> SharedTier | None:
    """The shared tier of `shared_tier_gib` GiB (None for 0), sized like a host tier (`tier_blocks`)."""
    if not shared_tier_gib:
        return None
    return SharedTier(tier_blocks(shared_tier_gib, block_size, geometry, "shared_tier_gib", "no shared tier"))
