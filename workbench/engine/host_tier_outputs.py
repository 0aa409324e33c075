"""What a prefix cache's host tier adds to a run's summary (docs/outputs.md): tokens hit in the host
tier and the bytes moved each way over the host link. Its two step columns (`host_token_slots`,
`host_free_slots`) come with each step's `StepEffects`."""

from __future__ import annotations

from typing import Any


def host_tier_totals(counters: dict[str, int], block_bytes: int) -> dict[str, Any]:
    """The summary's prefix counters (`Strategy.counters`) and, with a host tier, its figures (whole model,
    every layer; `block_bytes`: one block's KV)."""
    totals: dict[str, Any] = {k: counters[k] for k in ("prefix_query_tokens", "prefix_hit_tokens",
                                                        "prefix_evicted_blocks")}
    if "host_blocks_loaded" in counters:
        totals.update(prefix_hit_tokens_host=counters["prefix_hit_tokens_host"],
                      host_bytes_loaded=counters["host_blocks_loaded"] * block_bytes,
                      host_bytes_demoted=counters["host_blocks_demoted"] * block_bytes)
    return totals
