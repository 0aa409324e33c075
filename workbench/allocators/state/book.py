"""A paged pool's recurrent states (docs/recurrent.md): each live sequence's, and the checkpoints.

A state is `blocks_per_state` whole blocks of the pool, taken from the same free stack as KV blocks (vLLM's
hybrid allocator: one pool of equal pages, a recurrent layer group holding one page per request); the
snapshot's state classes count those blocks (its bytes fill `state_slots` of them). Checkpoints are
states copied at block boundaries (`policies`), keyed by the chain key of the prefix they end, at most
`cache_blocks` blocks of them; a checkpoint is held by no sequence, so the pool may evict it for room.

The book owns ids only: the strategy hands it blocks it took and gets back the blocks it gives up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.allocators.state.policies import boundaries, check_policy, eviction_rank
from workbench.intmath import cdiv

_NO_BLOCKS = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True)
class StateSpec:
    """What a pool needs to know of a model's recurrent state."""

    blocks_per_state: int  # pool blocks one sequence's state takes (>= 1)
    state_slots: int  # the state's bytes in pool slots, rounded up (<= blocks_per_state × block_size)
    policy: str = "none"  # the checkpoint policy (`policies.POLICIES`)
    cache_blocks: int = 0  # checkpoint memory, in blocks (whole states)
    # FLOPs to recompute a prefix of p tokens: p × per_token + p (p + 1) / 2 × per_token_pair (Marconi's efficiency)
    flops_per_token: float = 0.0
    flops_per_token_pair: float = 0.0

    def __post_init__(self) -> None:
        check_policy(self.policy)
        if self.blocks_per_state < 1 or self.state_slots < 1 or self.cache_blocks < 0:
            raise ValueError(f"state spec: blocks_per_state and state_slots must be >= 1 and cache_blocks >= 0, "
                             f"got {self.blocks_per_state}, {self.state_slots}, {self.cache_blocks}")

    def flops_saved(self, position: int) -> float:
        return position * self.flops_per_token + position * (position + 1) / 2 * self.flops_per_token_pair


class StateBook:
    def __init__(self, spec: StateSpec, block_size: int) -> None:
        if spec.state_slots > spec.blocks_per_state * block_size:
            raise ValueError(f"state spec: {spec.state_slots} slots do not fit {spec.blocks_per_state} blocks of "
                             f"{block_size}")
        self.spec = spec
        self.block_size = block_size
        # by the sequence's row of the strategy's tables (stable while it lives)
        self.live: dict[int, np.ndarray] = {}  # row -> its state's blocks, int32 [blocks_per_state]
        self._prompt: dict[int, tuple[int, int]] = {}  # row -> (prompt length, branch position)
        # chain key -> (blocks, position, last-use tick, FLOPs a hit saves)
        self.checkpoints: dict[int, tuple[np.ndarray, int, int, float]] = {}
        self.pinned = -1  # a checkpoint an admission in progress copies from: not evictable until it lands
        self._tick = 0
        self.saved = 0  # checkpoints taken
        self.evicted = 0  # checkpoints dropped for room (budget or pool)
        self.restored = 0  # hits that copied a checkpoint into a new sequence's state
        self._copies = 0  # state copies since the last `take_copies` (saves and restores)

    # -- live states --------------------------------------------------------------------------------

    def attach(self, rows: list[int], blocks: np.ndarray, prompt_len: int, branch: int) -> None:
        """Mutates. Each row's sequence gets its state (`blocks`, int32 [n × blocks_per_state], row after row)."""
        k = self.spec.blocks_per_state
        for i, row in enumerate(rows):
            self.live[row] = blocks[i * k:(i + 1) * k]
            self._prompt[row] = (prompt_len, branch)

    def detach(self, row: int) -> np.ndarray:
        """Mutates. The row's state blocks, to return to the pool."""
        self._prompt.pop(row)
        return self.live.pop(row)

    # -- checkpoints ----------------------------------------------------------------------------------

    def hit(self, keys: np.ndarray, num_hit: int) -> int:
        """Pure. The longest prefix of the `num_hit` cached blocks whose last block's key (`keys`, uint64) has a
        checkpoint: the blocks a hit may use."""
        for i in range(num_hit, 0, -1):
            if int(keys[i - 1]) in self.checkpoints:
                return i
        return 0

    def use(self, key: int) -> None:
        """Mutates. An admission copies checkpoint `key` into its state: it is pinned until `land`."""
        blocks, position, _, flops = self.checkpoints[key]
        self._tick += 1
        self.checkpoints[key] = (blocks, position, self._tick, flops)
        self.pinned = key
        self.restored += 1
        self._copies += 1

    def land(self) -> None:
        self.pinned = -1

    def wants(self, row: int, start: int, stop: int, final_len: int) -> list[int]:
        """Pure. Boundary positions in (start, stop] whose state the policy checkpoints for the row's sequence."""
        prompt_len, branch = self._prompt[row]
        return boundaries(self.spec.policy, start, stop, self.block_size, prompt_len, final_len, branch)

    def has(self, key: int) -> bool:
        return key in self.checkpoints

    @property
    def checkpoints_taken(self) -> bool:
        """Whether the policy and the budget let any checkpoint be taken (`none`, or a budget under one state:
        never)."""
        return self.spec.policy != "none" and self.room_for_one()

    def room_for_one(self) -> bool:
        """Whether the budget holds one more checkpoint (after evicting others)."""
        return self.spec.cache_blocks >= self.spec.blocks_per_state

    def make_room(self) -> np.ndarray | None:
        """Mutates when it returns blocks. Evicts checkpoints until one more fits the budget and returns their
        blocks; None, nothing changed, when only a pinned checkpoint could go."""
        k = self.spec.blocks_per_state
        need = self.held_blocks() + k - self.spec.cache_blocks
        if need <= 0:
            return _NO_BLOCKS
        count = cdiv(need, k)
        return self.evict(count) if count * k <= self.evictable() else None

    def save(self, key: int, position: int, blocks: np.ndarray) -> None:
        """Mutates. A checkpoint of the state at `position` (a copy into `blocks`)."""
        self._tick += 1
        self.checkpoints[key] = (blocks, position, self._tick, self.spec.flops_saved(position))
        self.saved += 1
        self._copies += 1

    def evictable(self) -> int:
        """Checkpoint blocks the pool may take back now."""
        pinned = self.spec.blocks_per_state if self.pinned in self.checkpoints else 0
        return self.held_blocks() - pinned

    def held_blocks(self) -> int:
        return len(self.checkpoints) * self.spec.blocks_per_state

    def evict(self, count: int) -> np.ndarray:
        """Mutates. Drops `count` checkpoints (never the pinned one) in the policy's order; their blocks."""
        if count <= 0:
            return _NO_BLOCKS
        keys = [key for key in self.checkpoints if key != self.pinned]
        entries = [self.checkpoints[key] for key in keys]
        order = eviction_rank(self.spec.policy, np.array([e[2] for e in entries], dtype=np.int64),
                              np.array([e[3] for e in entries], dtype=np.float64))[:count]
        if order.shape[0] < count:
            raise RuntimeError(f"out of checkpoints: {count} to evict, {order.shape[0]} evictable")
        self.evicted += count
        return np.concatenate([self.checkpoints.pop(keys[i])[0] for i in order.tolist()])

    def drop(self, keys: np.ndarray) -> np.ndarray:
        """Mutates. The checkpoints that end on these evicted blocks' keys (uint64) go with them, as a state
        stored with its block (vLLM) or at its radix node (SGLang) does: their blocks."""
        dropped = [self.checkpoints.pop(key)[0] for key in keys.tolist() if key in self.checkpoints]
        self.evicted += len(dropped)
        return np.concatenate(dropped) if dropped else _NO_BLOCKS

    def evict_blocks(self, num_blocks: int) -> np.ndarray:
        """Mutates. Evicts whole checkpoints until at least `num_blocks` blocks come free; their blocks."""
        return self.evict(cdiv(num_blocks, self.spec.blocks_per_state))

    def take_copies(self) -> int:
        """Mutates. State copies (checkpoint saves and restores) since the last call."""
        copies, self._copies = self._copies, 0
        return copies

    def block_ids(self) -> np.ndarray:
        """Every block the book holds (live states, then checkpoints), int32."""
        parts = list(self.live.values()) + [entry[0] for entry in self.checkpoints.values()]
        return np.concatenate(parts) if parts else _NO_BLOCKS

    def counters(self) -> dict[str, int]:
        return {"state_checkpoints_saved": self.saved, "state_checkpoints_evicted": self.evicted,
                "state_checkpoint_hits": self.restored}

    def check(self) -> None:
        """Raise AssertionError naming the first broken invariant of the book itself."""
        k = self.spec.blocks_per_state
        if any(blocks.shape[0] != k for blocks in self.live.values()):
            raise AssertionError("a live state does not hold blocks_per_state blocks")
        if any(entry[0].shape[0] != k for entry in self.checkpoints.values()):
            raise AssertionError("a checkpoint does not hold blocks_per_state blocks")
        if self.held_blocks() > max(self.spec.cache_blocks, 0):
            raise AssertionError(f"checkpoints hold {self.held_blocks()} blocks, over the budget of "
                                 f"{self.spec.cache_blocks}")
        if any(entry[1] % self.block_size or entry[1] < 1 for entry in self.checkpoints.values()):
            raise AssertionError("a checkpoint is not at a block boundary")
        if set(self._prompt) != set(self.live):
            raise AssertionError("live states and their prompts disagree")
