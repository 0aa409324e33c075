"""The summary's whole-run counters from a strategy's `counters()` (docs/outputs.md): prefix-cache
lookups, hits and evictions, with a host tier its hits and the bytes moved each way over the host
link, and with a fleet's shared tier this replica's hits there and the bytes it moved in and out. The
tiers' step columns (`host_token_slots`, `host_free_slots`, `shared_token_slots`, `shared_free_slots`)
come with each step's `StepEffects` instead."""

from __future__ import annotations

from typing import Any

from workbench.columns import SPEC_SUMMARY_KEYS, STATE_COUNTERS

# speculative decoding's counters (a run with spec_tokens > 0 has them, summed over a fleet's replicas): request
# steps verified, drafts written and drafts accepted
SPEC_COUNTERS = SPEC_SUMMARY_KEYS[:3]


def spec_rates(extra: dict[str, Any]) -> dict[str, Any]:
    """The summary's speculative-decoding rates from its counters (none without them): the share of drafts
    accepted and the tokens a request gains per verify step (accepted drafts + 1)."""
    if "spec_verified_steps" not in extra:
        return {}
    verified, drafts, accepted = (extra[k] for k in SPEC_COUNTERS)
    return {"spec_accept_rate": accepted / drafts if drafts else 0.0,
            "spec_tokens_per_step": 1.0 + accepted / verified if verified else 0.0}


def summed_spec_counters(extras: list[dict[str, Any]]) -> dict[str, Any]:
    """A fleet's speculative-decoding counters (its replicas' summed) and their rates; {} without speculation."""
    if "spec_verified_steps" not in extras[0]:
        return {}
    counters = {key: sum(e[key] for e in extras) for key in SPEC_COUNTERS}
    return {**counters, **spec_rates(counters)}


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
    if STATE_COUNTERS[0] in counters:  # a recurrent model's states (docs/recurrent.md)
        totals.update({k: counters[k] for k in STATE_COUNTERS})
    return totals
