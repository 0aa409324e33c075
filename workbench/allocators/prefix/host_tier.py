"""The host tier of a prefix cache (`--host-cache-gib`; docs/strategies.md, "Host tier").

When the device prefix cache evicts a cached block, its KV is *demoted*: copied into a block of a
host pool instead of being dropped (SGLang HiCache, LMCache, vLLM's CPU offloading). A later prompt
whose chain of keys continues past its device hits into the host tier gets those blocks *promoted*:
each is copied into a new device block and registered in the device index again. The tiers are
exclusive: a promoted block leaves the host tier, a demoted one the device index.

Keys are the device index's chain keys (`prefix.chains`: a key names its whole prefix), so a lookup
is a walk over a prompt's keys. The host pool has its own eviction order, least recently used first:
a demote into a full pool drops its LRU entry (its KV is lost, or passed down to a fleet's shared tier,
`prefix.shared_tier`). An entry demoted this step is not dropped again in the same step: its host block
would be written twice by one step's moves.

Moves are recorded here and handed to the engine once per step (`take_moves`), demotes then
promotes, each in the order they were decided. The kernel runner executes them before any other
device write of the step (after swap-outs), so a demote reads its block before the block is reused.
A host block read by a promote is not reused until the step ends (`take_moves` frees it): a later
demote of the same step would otherwise overwrite it before the promote has read it.

Host blocks are in exactly one state: holding a cached block (`num_used`), free, or read by a promote
this step (free from the next step; counted as free in the accounting).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from workbench.allocators.paged.block_stack import BlockStack
from workbench.allocators.prefix.leading import leading_held
from workbench.allocators.virtual.pages import DEFAULT_GEOMETRY_MODEL, KVGeometry
from workbench.presets import GIB

MAX_HOST_TIER_SLOTS = 2**31 - 1  # host slot ids are int32, like the device's
_NO_PAIRS = np.zeros((0, 2), dtype=np.int32)


class HostTier:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._block_of_key: OrderedDict[int, int] = OrderedDict()  # key -> host block, least recent first
        self._key_of_block: dict[int, int] = {}
        self._free = BlockStack(num_blocks)
        self._read_this_step: list[int] = []  # host blocks promoted this step, free once it ends
        self._demotes: list[tuple[int, int]] = []  # (device block, host block), in order
        self._promotes: list[tuple[int, int]] = []  # (host block, device block), in order
        self._written_this_step: set[int] = set()  # host blocks a demote writes this step: not replaced again
        self.demoted_blocks = 0  # device→host copies so far
        self.promoted_blocks = 0  # host→device copies so far

    def lookup(self, keys: np.ndarray) -> int:
        """Pure. How many leading `keys` (uint64 [k]) the host tier holds."""
        return leading_held(keys.tolist(), self._block_of_key)

    def take(self, keys: np.ndarray) -> np.ndarray:
        """Mutates. Remove the entries of `keys` (uint64 [k], all held: a `lookup` run) before they are
        promoted; returns their host blocks, int32 [k], read this step and freed when it ends."""
        blocks = [self._block_of_key.pop(key) for key in keys.tolist()]
        for block in blocks:
            del self._key_of_block[block]
        self._read_this_step.extend(blocks)
        return np.array(blocks, dtype=np.int32)

    def promote(self, host_blocks: np.ndarray, device_blocks: np.ndarray) -> None:
        """Mutates. Record the copies host block -> device block (int32 [k] each), after `take`."""
        self._promotes.extend(zip(host_blocks.tolist(), device_blocks.tolist(), strict=True))
        self.promoted_blocks += host_blocks.shape[0]

    def demote(self, keys: np.ndarray, device_blocks: np.ndarray) -> list[tuple[int, int, int]]:
        """Mutates. Device blocks (int32 [k]) evicted from the device index under `keys` (uint64 [k])
        are copied into host blocks: a free one, else the least recently used entry's (dropped), but
        never a block written by a demote this step (each host block is written at most once a step,
        so the step's moves need no order among themselves). A key the tier holds already is only
        marked used (its host copy is the same prefix); with no host block free nor replaceable, the
        evicted block is dropped.

        Returns what left the tier, in order, for a tier below it (`prefix.shared_tier`): (key, host
        block, -1) per dropped entry, whose KV is still in that host block until the step's demotes
        run; (key, -1, device block) per evicted block that found no host block."""
        index, written = self._block_of_key, self._written_this_step
        dropped = []
        for key, device in zip(keys.tolist(), device_blocks.tolist(), strict=True):
            if key in index:
                index.move_to_end(key)
                continue
            if self._free.size:
                host = int(self._free.pop(1)[0])
            else:
                victim = next((k for k, b in index.items() if b not in written), None)
                if victim is None:
                    dropped.append((key, -1, device))
                    continue
                host = index.pop(victim)
                del self._key_of_block[host]
                dropped.append((victim, host, -1))
            index[key] = host
            self._key_of_block[host] = key
            written.add(host)
            self._demotes.append((device, host))
            self.demoted_blocks += 1
        return dropped

    def take_moves(self) -> tuple[np.ndarray, np.ndarray]:
        """Mutates. The step ends: its (demotes int32 [k, 2] (device, host), promotes int32 [m, 2]
        (host, device)), and the host blocks its promotes read become free."""
        demotes = np.array(self._demotes, dtype=np.int32).reshape(-1, 2) if self._demotes else _NO_PAIRS
        promotes = np.array(self._promotes, dtype=np.int32).reshape(-1, 2) if self._promotes else _NO_PAIRS
        self._demotes, self._promotes = [], []
        self._written_this_step.clear()
        if self._read_this_step:
            self._free.push(np.array(self._read_this_step, dtype=np.int32))
            self._read_this_step = []
        return demotes, promotes

    def num_used(self) -> int:
        """Host blocks holding a cached block. Pure."""
        return len(self._block_of_key)

    def check_integrity(self) -> None:
        """Raise AssertionError unless every host block is in exactly one state. Pure."""
        used = list(self._block_of_key.values())
        states = np.concatenate([np.array(used, dtype=np.int64), self._free.ids().astype(np.int64),
                                 np.array(self._read_this_step, dtype=np.int64)])
        if states.shape[0] != self.num_blocks or not np.array_equal(np.sort(states), np.arange(self.num_blocks)):
            raise AssertionError(f"host tier: {len(used)} used + {self._free.size} free + "
                                 f"{len(self._read_this_step)} read this step do not partition {self.num_blocks} "
                                 "blocks exactly")
        if any(self._key_of_block.get(b) != k for k, b in self._block_of_key.items()) or \
                len(self._key_of_block) != len(used):
            raise AssertionError("host tier: key and block maps disagree")


def host_tier_for(host_cache_gib: float, block_size: int, geometry: KVGeometry | None) -> HostTier | None:
    """The host tier of `host_cache_gib` GiB (None for 0), sized by `tier_blocks`."""
    if not host_cache_gib:
        return None
    return HostTier(tier_blocks(host_cache_gib, block_size, geometry, "host_cache_gib", "no host tier"))


def tier_blocks(gib: float, block_size: int, geometry: KVGeometry | None, flag: str, none: str) -> int:
    """Blocks of a tier of `gib` GiB at the model's bytes per block (`geometry`, the default model's
    without one); raises ValueError naming `flag` if not even one fits or the slot ids would overflow."""
    geometry = geometry or KVGeometry.of(DEFAULT_GEOMETRY_MODEL, "fp16")
    block_bytes = geometry.num_buffers * geometry.buffer_bytes_per_token * block_size
    num_blocks = int(gib * GIB // block_bytes)
    if num_blocks < 1:
        raise ValueError(f"{flag} = {gib} holds no KV block of {block_bytes} bytes; raise it or use 0 ({none})")
    if num_blocks * block_size > MAX_HOST_TIER_SLOTS:
        raise ValueError(f"{flag} = {gib} is {num_blocks * block_size} token slots, more than "
                         f"{MAX_HOST_TIER_SLOTS} (int32 slot ids); lower it")
    return num_blocks
