"""The summary's whole-run counters from a strategy's `counters()` (docs/outputs.md): prefix-cache
lookups, hits and evictions, with a host tier its hits and the bytes moved each way over the host
link, and with a fleet's shared tier this replica's hits there and the bytes it moved in and out. The
tiers' step columns (`host_token_slots`, `host_free_slots`, `shared_token_slots`, `shared_free_slots`)
come with each step's `StepEffects` instead."""

from __future__ import annotations

from typing import Any


def summary_counters(counters: dict[str, int], block_bytes: int) -> dict[str, Any]:
    """The summary's counter inputs (`block_bytes`: one block's KV, whole model, every layer)."""
    totals: dict[str, Any] = {k: counters[k] for k in ("prefix_query_tokens", "prefix_hit_tokens",
                                                        "prefix_evicted_blocks")}
    if "host_blocks_loaded" in counters:  # a host tier
        totals.update(prefix_hit_tokens_host=counters["prefix_hit_tokens_host"],
                      host_bytes_loaded=counters["host_blocks_loaded"] * block_bytes,
                      host_bytes_demoted=counters["host_blocks_demoted"] * block_bytes)
    if "shared_blocks_loaded" in counters:  # a shared tier
        totals.update(prefix_hit_tokens_shared=counters["prefix_hit_tokens_shared"],
                      shared_bytes_loaded=counters["shared_blocks_loaded"] * block_bytes,
                      shared_bytes_demoted=counters["shared_blocks_demoted"] * block_bytes)
    return totals
