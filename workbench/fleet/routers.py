"""Routers: which replica of a fleet serves an arriving request (docs/fleet.md).

A router sees each replica through `ReplicaView` (its outstanding requests, the KV blocks its running
requests hold, and, for `kv-exact`, how much of a prompt its cache holds) at the arrival instant and
returns a replica index. Every router is deterministic: ties go to the lowest index, and
`power-of-two` draws from a generator seeded by the run's seed.
"""

from __future__ import annotations

import bisect
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from workbench.allocators.prefix.keys import block_keys
from workbench.workload.request import Request

SESSION_POINTS_PER_REPLICA = 160  # points of each replica on the hash ring (ketama's count)


class ReplicaView(Protocol):
    """What a router may read of a replica at the arrival instant. Pure."""

    def outstanding(self) -> int:
        """Requests routed here and neither finished nor rejected."""
        ...

    def active_blocks(self) -> int:
        """KV blocks held by this replica's running requests."""
        ...

    def cached_prompt_tokens(self, token_ids: np.ndarray) -> int:
        """Leading tokens of a prompt (int32 [T]) this replica's KV cache holds now (0 without a prefix cache)."""
        ...

    def inflight_prompt_tokens(self, prompt_keys: list[int]) -> int:
        """Leading full blocks of a prompt (its `prefix.keys.block_keys`), in tokens, shared with a request
        routed here and not yet admitted (its blocks enter the cache before this prompt is computed)."""
        ...

    def queued_prefill_tokens(self) -> int:
        """Prompt tokens routed here that no step has computed yet (waiting requests, whole; a
        recompute-preempted one with its output so far; the rest of a prompt prefilled in chunks)."""
        ...


class Router(ABC):
    """Chooses a replica per arriving request; `choose` may update the router's own state."""

    name: str

    def __init__(self, num_replicas: int, *, block_size: int, seed: int, overlap_weight: float = 1.0) -> None:
        self.num_replicas = num_replicas
        self.block_size = block_size
        self.seed = seed
        self.overlap_weight = overlap_weight  # kv-exact's weight of a block to prefill (Dynamo's default: 1)

    @abstractmethod
    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        """Mutates the router's state. The index of the replica that serves `request`."""


def least_loaded(replicas: Sequence[ReplicaView], among: Sequence[int] | None = None) -> int:
    """The replica with the fewest outstanding requests, the lowest index on a tie."""
    candidates = range(len(replicas)) if among is None else among
    return min(candidates, key=lambda i: (replicas[i].outstanding(), i))


class RoundRobin(Router):
    """Replica k of N gets the arrivals k, k + N, k + 2N, ... (the arrival order of the trace)."""

    name = "round-robin"

    def __init__(self, num_replicas: int, **kwargs) -> None:
        super().__init__(num_replicas, **kwargs)
        self._next = 0

    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        chosen = self._next
        self._next = (self._next + 1) % self.num_replicas
        return chosen


class LeastLoaded(Router):
    """Vidur's `lor` global scheduler: the replica with the fewest outstanding requests."""

    name = "least-loaded"

    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        return least_loaded(replicas)


class PowerOfTwo(Router):
    """Two distinct replicas drawn uniformly, the less loaded of them (the first drawn on a tie)."""

    name = "power-of-two"

    def __init__(self, num_replicas: int, **kwargs) -> None:
        super().__init__(num_replicas, **kwargs)
        self._rng = np.random.default_rng([self.seed, 0x2C401CE])

    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        if self.num_replicas == 1:
            return 0
        first, second = (int(i) for i in self._rng.choice(self.num_replicas, size=2, replace=False))
        return second if replicas[second].outstanding() < replicas[first].outstanding() else first


def _hash64(text: str) -> int:
    """A stable 64-bit hash of `text` (Python's own is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class Session(Router):
    """Consistent hashing on the session id: a ring of SESSION_POINTS_PER_REPLICA points per replica; a
    session goes to the first point at or after its hash, so every turn of a conversation meets its
    earlier turns' KV. Requests without a session id go round robin."""

    name = "session"

    def __init__(self, num_replicas: int, **kwargs) -> None:
        super().__init__(num_replicas, **kwargs)
        ring = sorted((_hash64(f"replica-{r}-{p}"), r) for r in range(num_replicas)
                      for p in range(SESSION_POINTS_PER_REPLICA))
        self._points = [point for point, _ in ring]
        self._owners = [owner for _, owner in ring]
        self._round_robin = RoundRobin(num_replicas, **kwargs)

    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        if request.session_id is None:
            return self._round_robin.choose(request, replicas)
        at = bisect.bisect_left(self._points, _hash64(request.session_id))
        return self._owners[at % len(self._points)]


class KVExact(Router):
    """Reads every replica's real KV cache, and the prompts routed to it that it has not admitted yet (the
    bound a router with perfect KV events and its own routing record reaches), and weighs that against
    load as NVIDIA Dynamo's KV router (`DefaultWorkerSelector`) does:

        cached_tokens  = max(prompt tokens its cache holds, prompt tokens a request queued there shares)
        prefill_blocks = (queued prefill tokens + prompt tokens - cached_tokens) / block_size
        decode_blocks  = blocks held by running requests + prompt blocks not cached
        cost = overlap_weight * prefill_blocks + decode_blocks    (overlap_weight: --kv-overlap-weight)

    the lowest cost wins (then the fewest outstanding requests, then the lowest index: Dynamo at its
    default temperature 0). The queued prompts count because the replica computes them, and so caches
    their blocks, before the new request (first come, first served): a router that read the cache alone
    would split a burst of requests sharing a new prefix over every replica, each of which then computes
    it (Dynamo likewise predicts the blocks of the requests it routed before their KV events arrive).
    Dynamo counts a prompt block as new to decode unless a running request holds it; here every cached
    block counts as held (a cached, unheld block is not told apart)."""

    name = "kv-exact"

    def choose(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        prompt_blocks = -(-request.prompt_tokens // self.block_size)
        token_ids = request.prompt_token_ids()  # once, for every replica's lookups
        keys = block_keys(token_ids, self.block_size).tolist()

        def cost(i: int) -> tuple[float, int, int]:
            view = replicas[i]
            cached_tokens = max(view.cached_prompt_tokens(token_ids), view.inflight_prompt_tokens(keys))
            prefill_blocks = (view.queued_prefill_tokens() + request.prompt_tokens - cached_tokens) / self.block_size
            decode_blocks = view.active_blocks() + prompt_blocks - cached_tokens // self.block_size
            return self.overlap_weight * prefill_blocks + decode_blocks, view.outstanding(), i

        return min(range(len(replicas)), key=cost)
