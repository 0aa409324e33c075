"""Which runs the compiled loop serves (workbench.engine.compiled_paged): a list that fails closed.

Every field of `RunConfig` and `SchedulerConfig` and every attribute of the `RooflineClock` is classified
here, as HANDLED (the loop does with it what the general loop does, for the reason given) or NEUTRAL (the one
value the loop assumes; any other sends the run to the general loop). A field or clock attribute that is in
neither is a decision nobody took yet: `applies` then refuses the loop, and tests/engine/test_compiled_eligible.py
fails until someone classifies it.
"""

from __future__ import annotations

import dataclasses
import math

from workbench.clock.roofline import FORMULA_CONSTANTS, RooflineClock
from workbench.config import RunConfig
from workbench.engine.scheduler_config import SchedulerConfig
from workbench.workload.request import RequestColumns

# False: every run takes the general loop (tests compare the two)
ENABLED = True

_STRATEGY = "the strategy object says whether the loop runs it (Strategy.compiled_pool)"
_VIRTUAL = "virtual-contiguous only: its page pool and extents, which the loop reads (Strategy.compiled_pool)"
_CAPACITY = "capacity and block size: the strategy's pool, which the loop reads"
_CLOCK = "a constant of the clock's step formula (workbench.clock.step_formula), which the loop calls"
_WORKLOAD = "the workload: its arrival and length columns are the loop's input; one sequence per request is checked"
_BEAMS = "read by beam search only; the loop takes one sequence per request (checked on the workload)"
_KERNEL = "read by the kernel runner only; the loop runs without one (kernel none)"
_FLEET = "read by a fleet's router only; the loop runs one replica (replicas 1, no disaggregation)"
_ORDER = "read by a cache-aware admission order only; the loop admits in arrival order (schedule fcfs)"
_SPEC = "read by speculative decoding only; the loop decodes one token per step (spec_tokens 0)"

RUN_HANDLED = {
    "strategy": _STRATEGY,
    "block_size": _CAPACITY, "model": _CAPACITY, "kv_dtype": _CAPACITY, "gpu": _CAPACITY, "tp": _CAPACITY,
    "weight_dtype": "capacity (the weights' bytes) and the per-row operator times the formula reads",
    "gpu_memory_utilization": _CAPACITY, "kv_gib": _CAPACITY, "kv_slots": _CAPACITY,
    "max_model_len": "the arrival verdict (rules.too_long)",
    "fit": "contiguous strategies only: " + _STRATEGY, "eviction": "prefix caches only: " + _STRATEGY,
    "pow2_round": "contiguous-pow2 only: " + _STRATEGY,
    "page_kib": _VIRTUAL, "max_batch": _VIRTUAL, "page_reuse": _VIRTUAL,
    "map_us_per_page": "virtual-contiguous only: the clock's map time per page, a constant of its step formula",
    "overlap_map": "virtual-contiguous only: whether the clock overlaps mapping, a constant of its step formula",
    "hybrid": "sliding-window layer groups only; the scheduler's attention_windows must be ()",
    "shared_link_gb_s": "prices shared-tier loads only; shared_tier_gib must be 0",
    "swap_gib": "the host pool of swap preemption only; preemption must be recompute",
    "workload": _WORKLOAD, "rate": _WORKLOAD, "num_requests": _WORKLOAD, "duration": _WORKLOAD, "seed": _WORKLOAD,
    "clock_profile": _CLOCK, "eff_bw": _CLOCK, "eff_flops": _CLOCK, "step_overhead_s": _CLOCK,
    "kernel_every": _KERNEL, "kernel_heads": _KERNEL, "verify_every": _KERNEL,
    "max_num_seqs": "the admission verdict", "max_num_batched_tokens": "the admission verdict (token budget)",
    "watermark_frac": "the admission verdict (watermark blocks, from the scheduler)",
    "beam_branch_frac": _BEAMS,
    "in_batch_prefix_tokens": _ORDER, "spec_method": _SPEC, "spec_accept": _SPEC,
    "router": _FLEET, "kv_overlap_weight": _FLEET, "kv_link_gb_s": _FLEET,
}
RUN_NEUTRAL = {
    "host_cache_gib": 0.0, "overlap_load": False, "shared_tier_gib": 0.0,
    "clock": "roofline", "kernel": "none", "preemption": "recompute", "chunked_prefill": False, "admission": "fcfs",
    "batching": "continuous", "schedule": "fcfs", "spec_tokens": 0, "n": 1, "beam_width": 1, "replicas": 1,
    "prefill_replicas": 0, "decode_replicas": 0,
    "state_checkpoints": "none", "state_cache_gib": None, "unify_page_size": False,
}

SCHEDULER_HANDLED = {
    "max_model_len": "the arrival verdict (rules.too_long)", "max_num_seqs": "the admission verdict",
    "max_num_batched_tokens": "the admission verdict (token budget)",
    "watermark_frac": "the admission verdict (the watermark in blocks: Admission.watermark_blocks)",
    "seed": _BEAMS + " and the random admission order (schedule must be fcfs)", "beam_branch_frac": _BEAMS,
    "in_batch_prefix_tokens": _ORDER, "spec_accept": _SPEC, "spec_draft_model": _SPEC,
}
SCHEDULER_NEUTRAL = {
    "swap": False, "kernel_every": None, "chunked_prefill": False, "admission": "fcfs", "schedule": "fcfs",
    "attention_windows": (),
    "batching": "continuous",  # static batching takes the general loop (its gate: rules.admits_now)
    "spec_tokens": 0,
}

# RooflineClock attributes beside the formula's constants (FORMULA_CONSTANTS)
CLOCK_HANDLED = {
    "K": "the formula's constants, passed to the loop",
    "rows_s_table": "per-row times, shared with the loop", "output_s_table": "per-row times, shared with the loop",
    "flops_per_s_table": "per-row times, shared with the loop", "need": "the formula's request for table entries",
    "forward": "computes the per-row tables", "flops_per_s": "computes the per-row tables",
    "_flops_per_s_at": "computes the per-row tables",
    "load_s_per_block": "prices host-tier loads only; the loop's strategy has no tiers",
    "shared_load_s_per_block": "prices shared-tier loads only; the loop's strategy has no tiers",
    "overlap_load": "prices tier loads only; the loop's strategy has no tiers",
    "num_layers": "prices a speculative step's draft model only: " + _SPEC,
}
CLOCK_NEUTRAL: dict = {"state_bytes_per_seq": 0.0}  # a recurrent model's states: the strategy holds none in the loop


def unclassified(cfg: RunConfig | None, sched_config: SchedulerConfig, clock) -> list[str]:
    """Pure. The fields and clock attributes that no list above names (each a decision nobody took)."""
    names = [] if cfg is None else [f"RunConfig.{f.name}" for f in dataclasses.fields(cfg)
                                    if f.name not in RUN_HANDLED and f.name not in RUN_NEUTRAL]
    names += [f"SchedulerConfig.{f.name}" for f in dataclasses.fields(sched_config)
              if f.name not in SCHEDULER_HANDLED and f.name not in SCHEDULER_NEUTRAL]
    names += [f"RooflineClock.{k}" for k in vars(clock)
              if k not in FORMULA_CONSTANTS and k not in CLOCK_HANDLED and k not in CLOCK_NEUTRAL]
    return names


def not_neutral(cfg: RunConfig | None, sched_config: SchedulerConfig, clock) -> list[str]:
    """Pure. The NEUTRAL fields and attributes whose value is not the one the loop assumes."""
    names = [] if cfg is None else [f"RunConfig.{k}" for k, v in RUN_NEUTRAL.items() if not _same(getattr(cfg, k), v)]
    names += [f"SchedulerConfig.{k}" for k, v in SCHEDULER_NEUTRAL.items() if not _same(getattr(sched_config, k), v)]
    names += [f"RooflineClock.{k}" for k, v in CLOCK_NEUTRAL.items() if not _same(getattr(clock, k), v)]
    return names


def applies(replica, cfg: RunConfig | None = None) -> bool:
    """Pure. Whether `replica` (a workbench.engine.replica.Replica, not imported: the loop sits below it in
    the import graph), not stepped yet, of a run configured by `cfg`, runs the plain case: every field and clock
    attribute classified and each NEUTRAL one at its value; a strategy that says the loop can run it
    (`compiled_pool`), no kernel runner and the roofline clock, no step timers, no shipped prompts, one sequence
    per request."""
    if not ENABLED:
        return False
    sched = replica.scheduler
    strategy, clock = sched.strategy, replica.clock
    if type(clock) is not RooflineClock or unclassified(cfg, sched.config, clock) \
            or not_neutral(cfg, sched.config, clock):
        return False
    return (strategy.compiled_pool() is not None
            and replica.runner is None and not replica.measured
            and replica.timers is None and replica.num_steps == 0 and replica.now_s == 0.0
            and not replica.steps.num_rows and not replica.steps.group_columns
            and not sched.device.swap and sched.needs_token_ids == strategy.wants_token_ids
            and not sched.arrivals.any_transferred() and sched.arrivals.next_index == 0
            and sched.step == 0 and not sched.live
            and _one_sequence_each(sched.arrivals.requests))


def _same(value, neutral) -> bool:
    if isinstance(neutral, float) and isinstance(value, float | int) and not isinstance(value, bool):
        return value == neutral and not math.isnan(value)
    return type(value) is type(neutral) and value == neutral


def _one_sequence_each(requests) -> bool:
    if isinstance(requests, RequestColumns):
        return requests.n == 1 and requests.beam_width == 1
    return all(r.n == 1 and r.beam_width == 1 for r in requests)
