"""The scheduler's verdicts, stated once (docs/engine.md): pure functions of integers.

The general step loop (workbench.engine.scheduler, admission) and the fleet's routers (workbench.fleet) call
them from Python; the compiled step loop (workbench.engine.compiled_paged) calls the same functions compiled
with numba (workbench.engine.compiled_rules), so a change to admission or preemption is one change here. Python
callers call them as Python: a compiled function's dispatch costs more than these few operations.
Each is written in the subset of Python that Numba compiles (no Python objects beyond numbers and arrays).
"""

from __future__ import annotations

import math

from workbench.intmath import cdiv

# admission_verdict: what becomes of the waiting group at the head of the line
PLACE = 0  # ask the strategy to place it
STOP = 1  # the step's token budget or max_num_seqs is spent: admission ends for this step
BELOW_WATERMARK = 2  # placing it would leave fewer free blocks than the watermark keeps for running groups


def next_event_s(now_s, ready, next_arrival_s):
    """When a replica's next step starts: now while it has work it can run (`ready`), else at its next arrival
    (math.inf: none is left), never before now."""
    return now_s if ready else max(now_s, next_arrival_s)


def too_long(prompt_tokens, output_tokens, max_model_len):
    """A request that can never run: its prompt and output exceed the model's length (rejected on arrival)."""
    return prompt_tokens + output_tokens > max_model_len


def final_kv_len(prompt_tokens, output_tokens):
    """KV rows a sequence holds when it finishes: its last output token is produced, never written back."""
    return prompt_tokens + output_tokens - 1


def recompute_tokens(prompt_tokens, generated_tokens):
    """Tokens a group computes when it is (re)admitted: its prompt, plus what it generated before a recompute
    preemption (one sequence re-prefills them as part of its prompt)."""
    return prompt_tokens + generated_tokens


def blocks_needed(tokens, block_size, num_seqs, state_blocks=0, pool_blocks_per_block=1):
    """Pool blocks a group of `num_seqs` sequences needs for `tokens` shared tokens: the tokens' blocks, one more
    per further sequence for its copy of a shared partial last block (an upper bound for paged pools), each
    taking `pool_blocks_per_block` blocks of the pool (a pool of layer groups holds one in each group: docs/
    hybrid.md), and each sequence's recurrent state of `state_blocks` blocks (docs/recurrent.md)."""
    return (cdiv(tokens, block_size) + num_seqs - 1) * pool_blocks_per_block + num_seqs * state_blocks


def admission_verdict(tokens, budget, spends_budget, running_seqs, num_seqs, max_num_seqs, needed_blocks,
                      allocatable_blocks, watermark_blocks):
    """What admission does with a waiting group of `num_seqs` sequences computing `tokens` this step (a shipped
    prompt spends no budget), with `running_seqs` on the device and `allocatable_blocks` free: STOP, PLACE or
    BELOW_WATERMARK (a watermark of 0 keeps nothing back)."""
    if (spends_budget and (tokens > budget or budget == 0)) or running_seqs + num_seqs > max_num_seqs:
        return STOP
    if watermark_blocks and allocatable_blocks - needed_blocks < watermark_blocks:
        return BELOW_WATERMARK
    return PLACE


def admits_now(static_batching, running_groups):
    """Whether a step may start groups (admit waiting ones, swap preempted ones back in) beside its decode batch:
    always under continuous batching; under static batching (FasterTransformer) only when no group is left
    running, so a batch admitted together runs, with nothing joining it, until its longest request ends."""
    return not static_batching or running_groups == 0


def refusal_is_final(running_seqs):
    """A group the pool cannot place (or that outgrows it) with no other sequence on the device: no block will
    ever come free for it, so it is rejected; otherwise it waits for running groups to free blocks."""
    return running_seqs == 0


def retires_victim(num_holders):
    """Whether the preemption victim is retired (rejected: it outgrows the pool) rather than preempted: it is the
    only group holding device KV, so nothing else can free blocks for it."""
    return num_holders == 1


def admits_after(preemptions):
    """Whether a step admits (swaps groups back in, admits waiting ones), given the groups its decode batch
    preempted to grow: a step that preempted admits nothing, so what the preemption freed goes to the running
    groups (the decode batch and a partial prefill, which continues)."""
    return preemptions == 0


def victim(arrival_order):
    """Position of the group preempted when the decode batch cannot grow: the latest arrived (largest request
    index) among those holding device KV, given as an int64 array of their request indices."""
    best = 0
    for k in range(1, arrival_order.shape[0]):
        if arrival_order[k] > arrival_order[best]:
            best = k
    return best


def tokens_left(output_tokens, generated_tokens):
    """Tokens a decoding group still has to generate: it is finished at 0."""
    return output_tokens - generated_tokens


# step_verdict: what a planned step does
RUN = 0  # something computes (or comes back from the host): the step runs
IDLE = 1  # nothing computes because every candidate was rejected: the loop goes on to the next event
STUCK = 2  # nothing computes and nothing was rejected: work is left that can never run


def step_verdict(computing_seqs, started_groups, newly_rejected):
    """Whether a planned step runs: RUN, IDLE or STUCK (the loop raises `reasons.stuck`)."""
    if computing_seqs or started_groups:
        return RUN
    return IDLE if newly_rejected else STUCK


def first_time(recorded_s, now_s):
    """A request's admission and first-token times are its first ones (NaN: none yet): readmission after a
    recompute preemption keeps them, so queueing delay and TTFT count from the first."""
    return now_s if math.isnan(recorded_s) else recorded_s
