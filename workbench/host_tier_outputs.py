"""What a prefix cache's host tier adds to a run's outputs (docs/outputs.md): two step columns and the
summary's host figures. Runs without a host tier have neither the columns nor anything but zeros."""

from __future__ import annotations

from typing import Any

from workbench.allocators.host_tier import HostTier

HOST_STEP_COLUMNS = ("host_token_slots", "host_free_slots")


def host_tier_columns(tier: HostTier, block_size: int) -> dict[str, int]:
    """The step row's host columns: cached token slots of the host tier and free ones (their sum is
    the tier's capacity at every step)."""
    used = tier.num_used()
    return {"host_token_slots": used * block_size, "host_free_slots": (tier.num_blocks - used) * block_size}


def host_tier_totals(strategy, kv_bytes_per_token: int) -> dict[str, Any]:
    """The summary's host-tier inputs of a finished run (none without a host tier): tokens hit in the
    host tier and the bytes moved each way over the host link (whole model, every layer)."""
    tier = getattr(strategy, "host_tier", None)
    if tier is None:
        return {}
    block_bytes = kv_bytes_per_token * strategy.block_size
    return {"prefix_hit_tokens_host": strategy.prefix_hit_tokens_host,
            "host_bytes_loaded": tier.promoted_blocks * block_bytes,
            "host_bytes_demoted": tier.demoted_blocks * block_bytes}
