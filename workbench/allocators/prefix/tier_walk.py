"""The tiers below a prefix cache's device blocks: its host tier, then the fleet's shared tier.

A prompt's chain of block keys continues past its device hits into the host tier (`prefix.host_tier`),
whose blocks are promoted (moved) into fresh device blocks, and past those into the shared tier
(`prefix.shared_tier`, this replica's side in `prefix.shared_port`), whose blocks are copied, not moved.
The walk goes down the tiers and never back up. Blocks the device evicts are demoted into the host tier,
whose drops go on to the shared tier; without a host tier they go straight to the shared tier; without
either they are dropped (and no `TierWalk` exists).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.allocators.prefix.host_tier import HostTier
from workbench.allocators.prefix.shared_port import SharedTierPort
from workbench.allocators.prefix.shared_tier import SharedTier
from workbench.allocators.values import NO_PAIRS, StepEffects


@dataclass(frozen=True)
class TierHits:
    """A prompt's blocks found below the device: `num_host` after the device hits, then `num_shared`."""

    num_host: int
    num_shared: int


NO_TIER_HITS = TierHits(0, 0)  # nothing below the device: no tiers, or none of the prompt's blocks in them


class TierWalk:
    def __init__(self, host_tier: HostTier | None, shared_tier: SharedTier | None) -> None:
        self.host = host_tier
        self.shared = SharedTierPort(shared_tier) if shared_tier is not None else None  # this replica's moves

    def lookup(self, keys: np.ndarray, num_dev: int, max_hit: int) -> TierHits:
        """Pure. The full blocks of a prompt (its chain `keys`, at most `max_hit` of them usable) that the
        host tier holds after the `num_dev` device hits, then the shared tier after those."""
        num_host = 0 if self.host is None else self.host.lookup(keys[num_dev:max_hit])
        above = num_dev + num_host
        num_shared = 0 if self.shared is None else self.shared.lookup(keys[above:max_hit])
        return TierHits(num_host, num_shared)

    def claim(self, keys: np.ndarray, num_dev: int, hits: TierHits) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Mutates the tiers. Out of the host tier and kept in the shared one, before the device takes blocks
        (whose evictions demote into them): (host blocks, shared blocks), None where there are none."""
        above = num_dev + hits.num_host
        host_blocks = self.host.take(keys[num_dev:above]) if hits.num_host else None
        shared_blocks = self.shared.read(keys[above:above + hits.num_shared]) if hits.num_shared else None
        return host_blocks, shared_blocks

    def promote(self, claimed: tuple[np.ndarray | None, np.ndarray | None], fresh: np.ndarray) -> None:
        """Mutates. The claimed blocks are copied into the first fresh device blocks, host ones first."""
        host_blocks, shared_blocks = claimed
        num_host = 0 if host_blocks is None else host_blocks.shape[0]
        if host_blocks is not None:
            self.host.promote(host_blocks, fresh[:num_host])
        if shared_blocks is not None:
            self.shared.promote(shared_blocks, fresh[num_host:num_host + shared_blocks.shape[0]])

    def demote(self, keys: np.ndarray, evicted: np.ndarray) -> None:
        """Mutates. Device blocks evicted under `keys` are copied out before the step's writes reuse them:
        into the host tier, whose drops go to the shared tier, or straight into the shared tier."""
        if self.host is None:
            self.shared.demote(keys, evicted)
            return
        dropped = self.host.demote(keys, evicted)
        if self.shared is not None:
            self.shared.take_dropped(dropped)

    def end_step(self, block_size: int) -> StepEffects:
        """Mutates: the tiers' step ends: the host tier's demotes and promotes and its two step columns
        (cached token slots and free ones, which sum to the tier's capacity), and this replica's moves in
        and out of the shared tier with the shared pool's two columns (the whole fleet's pool, as it
        stands after this step)."""
        demote = promote = spill = shared_demote = shared_promote = NO_PAIRS
        columns: tuple[tuple[str, int], ...] = ()
        if self.host is not None:
            demote, promote = self.host.take_moves()
            used = self.host.num_used()
            columns += (("host_token_slots", used * block_size),
                        ("host_free_slots", (self.host.num_blocks - used) * block_size))
        if self.shared is not None:
            spill, shared_demote, shared_promote = self.shared.take_moves()
            used = self.shared.tier.num_used()
            columns += (("shared_token_slots", used * block_size),
                        ("shared_free_slots", (self.shared.tier.num_blocks - used) * block_size))
        return StepEffects(demote=demote, promote=promote, shared_spill=spill, shared_demote=shared_demote,
                           shared_promote=shared_promote, columns=columns)

    def counters(self) -> dict[str, int]:
        """The blocks moved each way, per tier."""
        counters = {}
        if self.host is not None:
            counters.update(host_blocks_loaded=self.host.promoted_blocks, host_blocks_demoted=self.host.demoted_blocks)
        if self.shared is not None:
            counters.update(shared_blocks_loaded=self.shared.loaded_blocks,
                            shared_blocks_demoted=self.shared.demoted_blocks)
        return counters

    def check_integrity(self) -> None:
        if self.host is not None:
            self.host.check_integrity()
        if self.shared is not None:
            self.shared.tier.check_integrity()
