"""`cache-aware`: SGLang's router policy (sgl-router `CacheAwarePolicy`), over prompt blocks.

The router keeps, per replica, an approximate tree of the prompts it routed there (it never sees the
replica's real cache). A request is routed by load when the fleet is imbalanced, both
max - min > BALANCE_ABS and max > BALANCE_REL × min outstanding requests, to the least loaded
replica; otherwise to the replica whose tree matches the longest prefix of the prompt when the match
covers more than CACHE_THRESHOLD of it, else to the replica with the smallest tree. Either way the
prompt then enters the chosen replica's tree. A tree above MAX_TREE_TOKENS drops its least recently
used leaves.

Two simplifications, both stated in docs/fleet.md: SGLang's tree is over characters and here it is
over the engine's full prompt blocks (each block key names its whole prefix, so a dict of keys is the
tree), and SGLang trims its trees on a timer where this one trims on insertion.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from workbench.allocators.prefix.keys import block_keys
from workbench.allocators.prefix.leading import leading_held
from workbench.fleet.routers import ReplicaView, Router, least_loaded
from workbench.workload.request import Request

CACHE_THRESHOLD = 0.3  # a match must cover more than this fraction of the prompt
BALANCE_ABS = 64  # outstanding requests: imbalanced when max - min exceeds this ...
BALANCE_REL = 1.5  # ... and max exceeds this multiple of min
MAX_TREE_TOKENS = 2**24  # per replica


class PromptTree:
    """One replica's routed prompts: block key -> None, least recently used first. A prompt's keys are
    (re)inserted leaf first, so within one prompt a parent is always more recent than its child and
    trimming from the old end removes leaves before the blocks they hang from."""

    def __init__(self, block_size: int, max_tokens: int) -> None:
        self.block_size = block_size
        self.max_blocks = max(1, max_tokens // block_size)
        self._keys: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def matched_blocks(self, keys: list[int]) -> int:
        """Pure. Leading blocks of a prompt (its block keys) that the tree holds."""
        return leading_held(keys, self._keys)

    def insert(self, keys: list[int]) -> None:
        """Mutates. The prompt's blocks become the most recently used; the oldest leaves go above the limit."""
        for key in reversed(keys):
            self._keys[key] = None
            self._keys.move_to_end(key)
        while len(self._keys) > self.max_blocks:
            self._keys.popitem(last=False)


class CacheAware(Router):
    name = "cache-aware"

    def __init__(self, num_replicas: int, **kwargs) -> None:
        super().__init__(num_replicas, **kwargs)
        self.trees = [PromptTree(self.block_size, MAX_TREE_TOKENS) for _ in range(num_replicas)]
        self.routed_by_cache = 0  # requests sent to their best match (the rest went by load or tree size)

    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        keys = block_keys(request.prompt_token_ids(), self.block_size).tolist()
        loads = [r.outstanding() for r in replicas]
        if max(loads) - min(loads) > BALANCE_ABS and max(loads) > BALANCE_REL * min(loads):
            chosen = least_loaded(replicas)
        else:
            matched = [tree.matched_blocks(keys) for tree in self.trees]
            best = max(range(len(replicas)), key=lambda i: (matched[i], -loads[i], -i))
            if matched[best] * self.block_size > CACHE_THRESHOLD * request.prompt_tokens:
                chosen = best
                self.routed_by_cache += 1
            else:
                chosen = min(range(len(replicas)), key=lambda i: (len(self.trees[i]), i))
        self.trees[chosen].insert(keys)
        return chosen
