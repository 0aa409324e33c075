"""Names of every output column and summary figure (docs/memory.md, docs/outputs.md), defined once.

Writers and readers (engine, results, sweep, figures, notebooks) import these instead of typing
the strings again.
"""

SLOT_COLUMNS = (
    "token_slots",
    "reserved_slots",
    "internal_frag_slots",
    "cached_slots",
    "external_frag_slots",
    "free_slots",
)

STEP_COLUMNS = (
    "step", "t_s", "dt_s", "num_running", "num_waiting", "num_prefill_tokens", "num_decode_tokens",
    *SLOT_COLUMNS,
    "logical_token_slots", "block_table_bytes", "cow_copies", "preemptions", "swapped_blocks", "kernel_time_s",
    # the largest free contiguous extent (for ext_frag_index) and the whole blocks the live sequences
    # would occupy without sharing (for block-level sharing savings; allocated slots when nothing shares)
    "largest_free_extent_slots", "unshared_block_slots",
)

REQUEST_COLUMNS = (
    "request_id", "arrival_s", "admitted_s", "first_token_s", "finish_s", "prompt_tokens", "output_tokens",
    "prefix_hit_tokens", "num_preemptions", "status",
)

# a fleet run (docs/fleet.md): the summary's own keys, and the request columns of disaggregated
# prefill/decode (its prefill replica, when its prefill ended, when its KV reached its decode replica)
FLEET_SUMMARY_KEYS = ("replicas", "router", "load_imbalance", "kv_transfer_bytes", "per_replica")
DISAGGREGATED_REQUEST_COLUMNS = ("prefill_replica", "prefill_finish_s", "kv_arrived_s")

# speculative decoding (docs/speculative.md), in a run with spec_tokens > 0 only: the step columns, the request
# column and the summary keys (request steps verified, drafts written and accepted, their ratio, and the
# tokens a request gains per verify step)
SPEC_STEP_COLUMNS = ("draft_slots", "accepted_tokens", "rolled_back_slots")
SPEC_REQUEST_COLUMNS = ("accepted_tokens",)
SPEC_SUMMARY_KEYS = ("spec_verified_steps", "spec_draft_tokens", "spec_accepted_tokens", "spec_accept_rate",
                     "spec_tokens_per_step", "mem_draft_frac")

# a recurrent model (docs/recurrent.md), in its runs only: the two slot classes of its states as step columns, and
# the summary's shares of the pool (slot-seconds, as the other mem_*_frac) and checkpoint counters
STATE_STEP_COLUMNS = ("state_slots", "state_checkpoint_slots")
STATE_COUNTERS = ("state_checkpoints_saved", "state_checkpoints_evicted", "state_checkpoint_hits")
STATE_MEM_FRAC_KEYS = ("mem_state_frac", "mem_state_checkpoint_frac")  # one per STATE_STEP_COLUMNS
STATE_SUMMARY_KEYS = (*STATE_MEM_FRAC_KEYS, *STATE_COUNTERS)

# mem_<kind>_frac for each slot column, e.g. token_slots -> mem_token_frac
MEM_FRAC_KEYS = tuple("mem_" + c.removesuffix("_slots") + "_frac" for c in SLOT_COLUMNS)
MEM_FRAC_SAT_KEYS = tuple(k + "_sat" for k in MEM_FRAC_KEYS)

SUMMARY_KEYS = (
    "kv_slots", "num_requests", "sim_time_s",
    *MEM_FRAC_KEYS, *MEM_FRAC_SAT_KEYS,
    "ext_frag_index", "sharing_saving_frac", "block_sharing_saving_frac", "prefix_query_tokens",
    "prefix_hit_tokens", "prefix_hit_rate", "prefix_evicted_blocks",
    # a prefix cache's host tier (0 without one): hits there over the same prompt tokens, bytes each way
    "prefix_hit_rate_host", "host_bytes_loaded", "host_bytes_demoted",
    # a fleet's shared tier (0 without one): hits there over the same prompt tokens, bytes in and out of it
    "prefix_hit_rate_shared", "shared_bytes_loaded", "shared_bytes_demoted",
    "block_table_bytes_mean", "mean_batch_size", "max_batch_size",
    "throughput_req_s", "throughput_tok_s", "normalized_latency_s_per_tok",
    # over the saturated window (steps that end with a non-empty queue, docs/outputs.md): a run whose queue
    # never builds up has saturated_step_frac ~ 0 and says nothing about the memory-bound batch
    "saturated_step_frac", "mean_batch_size_sat", "throughput_tok_s_sat",
    "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
    "num_finished", "num_rejected", "num_preemptions", "cow_copies",
    # trace rows the reader dropped as failed requests (0 output tokens; failed=drop, docs/workloads.md)
    "num_failed_rows_dropped",
    "kernel_backend", "kernel_time_s", "kernel_gbps", "verify_max_rel_err", "sim_wall_s",
)

# Every summary figure is a finite number except these, which are text. A figure with nothing to measure (no
# saturated step, no finished request, no verification, a replica that served nothing) is 0, never NaN, except
# the memory fractions of a pool no step used, which was all free (docs/outputs.md).
SUMMARY_TEXT_KEYS = ("kernel_backend",)

# Summary keys measured in wall time: they differ between otherwise identical runs.
WALL_CLOCK_KEYS = ("sim_wall_s", "kernel_time_s", "kernel_gbps")
# Summary keys computed from the attention kernels' float32 output: bit-identical on one machine, equal to
# float32 rounding across CPUs (fastmath: the vector width decides the summation order). Every other
# summary key and every step and request column is exact and identical on any machine.
KERNEL_NUMERIC_KEYS = ("verify_max_rel_err",)
