"""The roofline clock's step-time formula, stated once (workbench.clock.roofline, docs/engine.md).

`RooflineClock` calls these functions from Python and the compiled step loop (workbench.engine.compiled_paged)
calls them from Numba, so both price a step with the same doubles, operation for operation (no fastmath).

The clock's constants travel as one float64 array `K` (indices below, built by `RooflineClock`); the
per-row operator times, which only Python computes (the operators are objects), as three tables indexed by
row count with NaN where not computed yet: `rows_s[n]` (the per-row operators of a step with n rows),
`output_s[n]` (the output layer for n sampled rows) and `flops_per_s[n]` (the GEMM FLOP rate at n rows).
A formula that finds a table entry missing returns NaN and names the rows it lacks in `need`; the caller
fills them and calls again.
"""

from __future__ import annotations

import math

from numba import njit

# K: the clock's constants, float64 [NUM_CONSTS]
(KV_BYTES_PER_TOKEN, ATTN_BYTES_PER_ROW, BYTES_PER_S, ATTN_FLOPS_PER_KEY, ATTN_S_PER_BLOCK_READ, ATTENTION_LAUNCH_S,
 KERNEL_LAUNCH_S, BLOCK_BYTES, TP, ALLREDUCE_FIXED_S, ALLREDUCE_S_PER_TOKEN, MAP_S_PER_PAGE, OVERLAP_MAP,
 LINK_BYTES_PER_S, SWAP_FIXED_S_PER_BLOCK, STEP_OVERHEAD_S, SEPARATE_PREFILL, PREFILL_OVERHEAD_S,
 NUM_CONSTS) = range(19)

# need: the table entries a formula lacked, int64 [4]
NEED_ROWS_A, NEED_ROWS_B, NEED_SAMPLED_A, NEED_SAMPLED_B = range(4)


@njit(cache=True)
def step_s(K, rows_s, output_s, flops_per_s, num_tokens, kv_read_tokens, attn_query_ctx, copied_blocks,
           swapped_blocks, measured_attention_s, mapped_pages, decode_blocks, sampled_tokens):
    """Duration of one iteration (`RooflineClock.step_s` documents the arguments); `measured_attention_s` NaN:
    attention is modeled. The tables must hold `num_tokens` and `sampled_tokens`."""
    compute_s = rows_s[num_tokens] + output_s[sampled_tokens]
    if math.isnan(measured_attention_s):
        kv_bytes = (num_tokens + kv_read_tokens) * K[KV_BYTES_PER_TOKEN] + num_tokens * K[ATTN_BYTES_PER_ROW]
        compute_s += max(kv_bytes / K[BYTES_PER_S], attn_query_ctx * K[ATTN_FLOPS_PER_KEY] / flops_per_s[num_tokens])
        compute_s += decode_blocks * K[ATTN_S_PER_BLOCK_READ]  # a measured kernel includes its own
    else:
        compute_s += num_tokens * K[KV_BYTES_PER_TOKEN] / K[BYTES_PER_S] + measured_attention_s / K[TP]
    compute_s += K[ATTENTION_LAUNCH_S]
    if copied_blocks:  # copy-on-write: one copy kernel reads and writes each block
        compute_s += 2.0 * copied_blocks * K[BLOCK_BYTES] / K[BYTES_PER_S] + K[KERNEL_LAUNCH_S]
    if K[TP] > 1:
        compute_s += K[ALLREDUCE_FIXED_S] + num_tokens * K[ALLREDUCE_S_PER_TOKEN]
    map_s = mapped_pages * K[MAP_S_PER_PAGE]
    compute_s = max(compute_s, map_s) if K[OVERLAP_MAP] else compute_s + map_s
    swap_s = swapped_blocks * K[BLOCK_BYTES] / K[LINK_BYTES_PER_S] + swapped_blocks * K[SWAP_FIXED_S_PER_BLOCK]
    return compute_s + swap_s + K[STEP_OVERHEAD_S]


@njit(cache=True)
def compute_s(K, rows_s, output_s, flops_per_s, need, num_prefill_tokens, num_decode_tokens, kv_read_tokens,
              attn_query_ctx, decode_ctx_tokens, copied_blocks, swapped_blocks, measured_attention_s, mapped_pages,
              decode_blocks, sampled_tokens):
    """Duration of a step's compute (a `StepCost`'s counts, `RooflineClock.cost_s` less the tier loads): one
    iteration, or, where the engine runs prompts and decodes as separate iterations (K[SEPARATE_PREFILL]) and the
    step has both, the decode iteration then the prompt iteration, each with its own weight pass and overhead.
    Under separate iterations a prompt iteration pays K[PREFILL_OVERHEAD_S] where a decode iteration pays
    K[STEP_OVERHEAD_S]: a profile may fit the two kinds' overheads apart (docs/clock-profiles.md).
    A measured attention time covers both iterations, and page mapping both: both are charged to the decode
    iteration. NaN, with `need` set, when a table lacks an entry."""
    num_tokens = num_prefill_tokens + num_decode_tokens
    separate = K[SEPARATE_PREFILL] != 0 and num_prefill_tokens > 0 and num_decode_tokens > 0
    rows_a = num_decode_tokens if separate else num_tokens
    rows_b = num_prefill_tokens if separate else 0
    sampled_a = num_decode_tokens if separate else sampled_tokens
    sampled_b = sampled_tokens - num_decode_tokens if separate else 0
    if rows_a >= rows_s.shape[0] or rows_b >= rows_s.shape[0] or sampled_a >= output_s.shape[0] \
            or sampled_b >= output_s.shape[0] or math.isnan(rows_s[rows_a]) or math.isnan(rows_s[rows_b]) \
            or math.isnan(output_s[sampled_a]) or math.isnan(output_s[sampled_b]):
        need[NEED_ROWS_A], need[NEED_ROWS_B], need[NEED_SAMPLED_A], need[NEED_SAMPLED_B] = \
            rows_a, rows_b, sampled_a, sampled_b
        return math.nan
    if not separate:
        one_s = step_s(K, rows_s, output_s, flops_per_s, num_tokens, kv_read_tokens, attn_query_ctx, copied_blocks,
                       swapped_blocks, measured_attention_s, mapped_pages, decode_blocks, sampled_tokens)
        if K[SEPARATE_PREFILL] != 0 and num_prefill_tokens > 0 and num_decode_tokens == 0:
            return one_s + (K[PREFILL_OVERHEAD_S] - K[STEP_OVERHEAD_S])  # a prompt iteration's own overhead
        return one_s
    ctx = decode_ctx_tokens
    decode_s = step_s(K, rows_s, output_s, flops_per_s, num_decode_tokens, ctx, ctx, copied_blocks, swapped_blocks,
                      measured_attention_s, mapped_pages, decode_blocks, num_decode_tokens)
    prefill_measured_s = measured_attention_s if math.isnan(measured_attention_s) else 0.0
    prefill_s = step_s(K, rows_s, output_s, flops_per_s, num_prefill_tokens, kv_read_tokens - ctx,
                       attn_query_ctx - ctx, 0, 0, prefill_measured_s, 0, 0, sampled_b)
    return decode_s + prefill_s + (K[PREFILL_OVERHEAD_S] - K[STEP_OVERHEAD_S])  # the prompt iteration's overhead
