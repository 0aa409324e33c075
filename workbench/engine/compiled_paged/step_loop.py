"""The step loop of a plain `paged` run, compiled with Numba (workbench.engine.compiled_paged).

It is `Replica.step` with the `Scheduler`, `Admission`, `PagedStrategy`, `CostMeter` and `RooflineClock`
calls of a plain run written out, in the same order, over arrays: arrivals join the waiting queue (or are
rejected), the decode batch appends one slot per sequence (preempting the latest-arrived group while it
cannot), then — unless something was preempted — waiting groups are admitted first come first served,
the clock prices the step, prefilled groups produce their first token and join the batch, finished
groups give their blocks back, and one step row is written. Blocks are real: each sequence holds a chain
of block ids taken from a free stack (`BlockStack`'s order: a fresh stack pops 0, 1, 2, ...).

The loop stops and returns to the caller (`run_steps`' status) whenever it needs something only Python has
or an output buffer is full; every state it stops in is one it can resume from:
  DONE         every request is finished or rejected
  ROWS_FULL    the step-row buffer is full (the caller hands the rows on and resets S[ROWS])
  EVENTS_FULL  the buffer of finished and rejected requests may not hold this step's (the caller logs them and
               resets S[EVENTS], or grows the buffer when it is already empty)
  GROW         the next arrival needs a larger request window or waiting ring
  NEED_CLOCK   the step is planned (S[PHASE] = 1) and the clock's per-row tables lack the entries `need` names
               (workbench.clock.step_formula; the caller fills them from the clock)
  STUCK        work is left that can never run (the caller raises, as `Replica.step` does)

The verdicts (arrival, admission, the victim, finishing, a step that cannot run) are workbench.engine.rules'
and the step's duration is workbench.clock.step_formula's, the same functions the general loop calls; no
fastmath, so the step times are the same doubles.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from workbench.clock import step_formula
from workbench.engine import rules

# statuses
DONE, ROWS_FULL, EVENTS_FULL, GROW, NEED_CLOCK, STUCK = 0, 1, 2, 3, 4, 5

# S: the loop's integer state, int64 [NUM_STATE]
(NEXT_ARRIVAL, STEP, NBATCH, WAIT_HEAD, NWAIT, RUNNING_SEQS, FREE_TOP, FREE_SLOTS_TOP, PHASE, ROWS, EVENTS,
 LOG_BASE, LOG_READY, NUM_FINISHED, NUM_REJECTED, GENERATED_TOKENS,
 # the planned step (PHASE 1): its cost and its snapshot
 P_NUM_DECODE, P_NPF, P_NUM_PREFILL, P_KV_READ, P_ATTN_CTX, P_DECODE_CTX, P_DECODE_BLOCKS, P_UNSHARED_SLOTS,
 P_PREEMPTIONS, P_TOKEN_SLOTS, P_RESERVED, P_FREE_SLOTS, P_TABLE_ENTRIES, NUM_STATE) = range(30)

# C: the run's integer constants, int64 [NUM_CONSTS]
BLOCK_SIZE, MAX_MODEL_LEN, MAX_NUM_SEQS, MAX_BATCHED, WATERMARK, CAPACITY_SLOTS, NUM_CONSTS = range(7)

# why a request ended (the event buffer's code column; workbench.engine.compiled_paged.drive words them)
FINISHED, REJECT_TOO_LONG, REJECT_POOL, REJECT_WATERMARK, REJECT_BLOCKS = 0, 1, 2, 3, 4

# step-row columns (INT_STEP_COLUMNS order, workbench.results)
NUM_INT_COLUMNS = 18


@njit(cache=True)
def _log_done(S, log_done, i):
    """Request i is finished or rejected: the done prefix of the request window grows past it."""
    base = S[LOG_BASE]
    log_done[i - base] = True
    if i == S[LOG_READY]:
        k = i - base
        while k < log_done.shape[0] and log_done[k]:
            k += 1
        S[LOG_READY] = base + k


@njit(cache=True)
def _event(S, events, i, code, a, b):
    e = S[EVENTS]
    events[e, 0], events[e, 1], events[e, 2], events[e, 3] = i, code, a, b
    S[EVENTS] = e + 1


@njit(cache=True)
def _free_seq(S, slot, s_head, s_nblocks, next_block, free_stack, free_slots):
    """The sequence in `slot` gives its blocks back (pushed so that its first block is popped first, as
    `BlockStack.push` of a table) and its slot."""
    top = S[FREE_TOP] + s_nblocks[slot]
    b = s_head[slot]
    for k in range(s_nblocks[slot]):
        free_stack[top - 1 - k] = b
        b = next_block[b]
    S[FREE_TOP] = top
    free_slots[S[FREE_SLOTS_TOP]] = slot
    S[FREE_SLOTS_TOP] += 1


@njit(cache=True)
def _take_block(S, slot, s_head, s_tail, s_nblocks, next_block, free_stack):
    """One block from the top of the free stack onto the end of the sequence's chain."""
    S[FREE_TOP] -= 1
    b = free_stack[S[FREE_TOP]]
    if s_nblocks[slot] == 0:
        s_head[slot] = b
    else:
        next_block[s_tail[slot]] = b
    s_tail[slot] = b
    s_nblocks[slot] += 1


@njit(cache=True)
def _leave_batch(S, batch, slot):
    """The sequence in `slot` leaves the decode batch; the others keep their order."""
    n = S[NBATCH]
    k = 0
    while batch[k] != slot:
        k += 1
    for m in range(k, n - 1):
        batch[m] = batch[m + 1]
    S[NBATCH] = n - 1


@njit(cache=True)
def run_steps(S, F, C, K, arrival_s, prompt, output, rows_s, flops_per_s, output_s, need, g_generated, g_slot, wait,
              s_req, s_len, s_final, s_head, s_tail, s_nblocks, batch, free_slots, free_stack, next_block, prefilled,
              log_admitted, log_first, log_finish, log_preempt, log_done, events, rows_f, rows_i):
    """Step until a status (module docstring) says to stop. `F[0]` is the replica's clock (s). Per request
    i (ring position i & (len - 1) of `g_generated` and `g_slot`): tokens generated, device slot or -1;
    `wait` a ring of request indices (head S[WAIT_HEAD]); per device slot: its request, length, final
    length and block chain (first and last block, `s_nblocks` of them linked by `next_block`); `batch`
    the decoding slots in join order; `prefilled` this step's admitted slots; the `log_*` arrays are the
    RequestLog window (row i - S[LOG_BASE])."""
    while True:
        if S[PHASE] == 0:
            if S[ROWS] == rows_f.shape[0]:
                return ROWS_FULL
            status = _arrive(S, F, C, arrival_s, prompt, output, g_generated, g_slot, wait, log_done, events)
            if status >= 0:
                return status
            if S[NBATCH] == 0 and S[NWAIT] == 0:  # every request that arrived now was rejected
                continue
            # a step ends at most every waiting group and the batch's (a retired group and the admitted ones)
            if S[EVENTS] + S[NWAIT] + 2 * C[MAX_NUM_SEQS] + 1 > events.shape[0]:
                return EVENTS_FULL
            rejected_before = S[NUM_REJECTED]
            preemptions = _append_or_preempt(S, C, g_slot, wait, s_req, s_len, s_head, s_tail, s_nblocks, batch,
                                             free_slots, free_stack, next_block, log_preempt, log_done, events)
            npf = 0
            if preemptions == 0:
                npf = _admit(S, F, C, prompt, output, g_generated, g_slot, wait, s_req, s_len, s_final, s_head,
                             s_tail, s_nblocks, free_slots, free_stack, next_block, prefilled, log_admitted, log_done,
                             events)
            verdict = rules.step_verdict(S[NBATCH] + npf, 0, S[NUM_REJECTED] - rejected_before)
            if verdict != rules.RUN:
                if verdict == rules.STUCK:
                    return STUCK
                continue
            _plan(S, C, preemptions, npf, s_len, s_final, s_nblocks, batch, prefilled)
            S[PHASE] = 1
        dt_s = step_formula.compute_s(K, rows_s, output_s, flops_per_s, need, S[P_NUM_PREFILL], S[P_NUM_DECODE],
                                      S[P_KV_READ], S[P_ATTN_CTX], S[P_DECODE_CTX], 0, 0, math.nan, 0,
                                      S[P_DECODE_BLOCKS], S[P_NUM_DECODE] + S[P_NPF])
        if math.isnan(dt_s):
            return NEED_CLOCK
        F[0] += dt_s
        S[STEP] += 1
        _complete(S, F[0], output, g_generated, g_slot, s_req, s_head, s_nblocks, batch, prefilled, free_slots,
                  free_stack, next_block, log_first, log_finish, log_done, events)
        _record(S, C, F[0], dt_s, rows_f, rows_i)
        S[PHASE] = 0


@njit(cache=True)
def _arrive(S, F, C, arrival_s, prompt, output, g_generated, g_slot, wait, log_done, events):
    """The clock moves to the next event (now while there is work, else the next arrival:
    `Replica.next_event_s`) and the requests that arrived by then join the waiting queue or are rejected
    (`Scheduler.arrive`). Returns DONE when no request is left, GROW when the next arrival needs room,
    else -1."""
    num_requests = arrival_s.shape[0]
    gmask = g_slot.shape[0] - 1
    wcap = wait.shape[0]
    if S[NBATCH] == 0 and S[NWAIT] == 0:
        if S[NEXT_ARRIVAL] == num_requests:
            return DONE
        F[0] = max(F[0], arrival_s[S[NEXT_ARRIVAL]])
    while S[NEXT_ARRIVAL] < num_requests and arrival_s[S[NEXT_ARRIVAL]] <= F[0]:
        i = S[NEXT_ARRIVAL]
        if i - S[LOG_BASE] >= log_done.shape[0] or i - S[LOG_READY] > gmask or S[NWAIT] == wcap \
                or S[EVENTS] == events.shape[0]:
            return GROW
        S[NEXT_ARRIVAL] = i + 1
        if rules.too_long(np.int64(prompt[i]), np.int64(output[i]), C[MAX_MODEL_LEN]):  # int32 columns widened
            S[NUM_REJECTED] += 1
            _event(S, events, i, REJECT_TOO_LONG, np.int64(prompt[i]) + output[i], C[MAX_MODEL_LEN])
            _log_done(S, log_done, i)
            continue
        g_generated[i & gmask] = 0
        g_slot[i & gmask] = -1
        wait[(S[WAIT_HEAD] + S[NWAIT]) % wcap] = i
        S[NWAIT] += 1
    return -1


@njit(cache=True)
def _append_or_preempt(S, C, g_slot, wait, s_req, s_len, s_head, s_tail, s_nblocks, batch, free_slots, free_stack,
                       next_block, log_preempt, log_done, events):
    """The decode batch appends one slot per sequence, all or nothing; while the free blocks cannot supply
    it, the latest-arrived group is preempted for recompute (first in line again), or rejected when it is
    the only one (`Scheduler.schedule`). Returns the preemptions."""
    bs = C[BLOCK_SIZE]
    gmask = g_slot.shape[0] - 1
    wcap = wait.shape[0]
    preemptions = 0
    while S[NBATCH] > 0:
        need = 0
        for k in range(S[NBATCH]):
            need += s_len[batch[k]] % bs == 0
        if need <= S[FREE_TOP]:
            for k in range(S[NBATCH]):
                slot = batch[k]
                if s_len[slot] % bs == 0:
                    _take_block(S, slot, s_head, s_tail, s_nblocks, next_block, free_stack)
                s_len[slot] += 1
            return preemptions
        victim = batch[rules.victim(s_req[batch[:S[NBATCH]]])]
        i = s_req[victim]
        last_one = S[NBATCH] == 1
        _leave_batch(S, batch, victim)
        S[RUNNING_SEQS] -= 1
        _free_seq(S, victim, s_head, s_nblocks, next_block, free_stack, free_slots)
        g_slot[i & gmask] = -1
        if last_one:  # the only holder of the pool cannot grow
            S[NUM_REJECTED] += 1
            _event(S, events, i, REJECT_POOL, 0, 0)
            _log_done(S, log_done, i)
        else:
            log_preempt[i - S[LOG_BASE]] += 1
            S[WAIT_HEAD] = (S[WAIT_HEAD] - 1) % wcap
            wait[S[WAIT_HEAD]] = i
            S[NWAIT] += 1
            preemptions += 1
    return preemptions


@njit(cache=True)
def _admit(S, F, C, prompt, output, g_generated, g_slot, wait, s_req, s_len, s_final, s_head, s_tail, s_nblocks,
           free_slots, free_stack, next_block, prefilled, log_admitted, log_done, events):
    """Waiting groups are admitted first come first served under the token budget, max_num_seqs and the
    watermark, each taking the blocks of its prompt and what it generated before a preemption
    (`Admission.admit`, `PagedStrategy.admit`); a group the empty pool cannot place is rejected. Returns
    how many were admitted (their slots in `prefilled`)."""
    bs = C[BLOCK_SIZE]
    gmask = g_slot.shape[0] - 1
    wcap = wait.shape[0]
    npf = 0
    budget = C[MAX_BATCHED]
    while S[NWAIT] > 0:
        i = wait[S[WAIT_HEAD]]
        tokens = rules.recompute_tokens(np.int64(prompt[i]), g_generated[i & gmask])
        need = rules.blocks_needed(tokens, bs, 1)
        verdict = rules.admission_verdict(tokens, budget, True, S[RUNNING_SEQS], 1, C[MAX_NUM_SEQS], need,
                                          S[FREE_TOP], C[WATERMARK])
        if verdict == rules.STOP:
            break
        refusal = -1
        if verdict == rules.BELOW_WATERMARK:
            refusal = REJECT_WATERMARK
        elif need > S[FREE_TOP]:  # PagedStrategy.admit's refusal (`blocks_refused`)
            refusal = REJECT_BLOCKS
        if refusal >= 0 and not rules.refusal_is_final(S[RUNNING_SEQS]):  # blocks will come free: it waits
            break
        S[WAIT_HEAD] = (S[WAIT_HEAD] + 1) % wcap
        S[NWAIT] -= 1
        if refusal >= 0:  # the empty pool cannot place it: nothing ever will
            S[NUM_REJECTED] += 1
            _event(S, events, i, refusal, need, S[FREE_TOP])
            _log_done(S, log_done, i)
            continue
        S[FREE_SLOTS_TOP] -= 1
        slot = free_slots[S[FREE_SLOTS_TOP]]
        s_nblocks[slot] = 0
        for _ in range(need):
            _take_block(S, slot, s_head, s_tail, s_nblocks, next_block, free_stack)
        s_req[slot], s_len[slot], s_final[slot] = i, tokens, np.int64(prompt[i]) + output[i] - 1
        g_slot[i & gmask] = slot
        j = i - S[LOG_BASE]
        if math.isnan(log_admitted[j]):
            log_admitted[j] = F[0]
        S[RUNNING_SEQS] += 1
        budget -= tokens
        prefilled[npf] = slot
        npf += 1
    return npf


@njit(cache=True)
def _plan(S, C, preemptions, npf, s_len, s_final, s_nblocks, batch, prefilled):
    """The planned step's cost (`CostMeter.cost`) and snapshot (`PagedStrategy.snapshot`), into S. An admitted
    sequence's length is its whole prompt (and recomputed tokens), all of it written this step."""
    bs = C[BLOCK_SIZE]
    num_decode = S[NBATCH]
    decode_ctx = decode_blocks = 0
    for k in range(num_decode):
        decode_ctx += s_len[batch[k]]
        decode_blocks += s_nblocks[batch[k]]
    num_prefill = attn_ctx_prefill = prefill_blocks = 0
    for k in range(npf):
        tokens = s_len[prefilled[k]]
        num_prefill += tokens
        attn_ctx_prefill += tokens * (tokens + 1) // 2  # queries at 0..tokens-1 attend to q + 1 keys each
        prefill_blocks += s_nblocks[prefilled[k]]
    reserved = 0  # unwritten slots of last blocks that their sequence will write
    for k in range(num_decode + npf):
        slot = batch[k] if k < num_decode else prefilled[k - num_decode]
        reserved += min(s_final[slot], s_nblocks[slot] * bs) - s_len[slot]
    S[P_NUM_DECODE], S[P_NPF], S[P_NUM_PREFILL] = num_decode, npf, num_prefill
    S[P_KV_READ], S[P_ATTN_CTX] = decode_ctx + num_prefill, decode_ctx + attn_ctx_prefill
    S[P_DECODE_CTX], S[P_DECODE_BLOCKS] = decode_ctx, decode_blocks
    S[P_UNSHARED_SLOTS] = (decode_blocks + prefill_blocks) * bs
    S[P_PREEMPTIONS], S[P_TOKEN_SLOTS], S[P_RESERVED] = preemptions, decode_ctx + num_prefill, reserved
    S[P_FREE_SLOTS], S[P_TABLE_ENTRIES] = S[FREE_TOP] * bs, decode_blocks + prefill_blocks


@njit(cache=True)
def _complete(S, now_s, output, g_generated, g_slot, s_req, s_head, s_nblocks, batch, prefilled, free_slots,
              free_stack, next_block, log_first, log_finish, log_done, events):
    """The step ended at `now_s` (`Scheduler.complete`): every decoding sequence produced a token, every
    prefilled one its first and joins the batch, and the groups with all their tokens are freed."""
    gmask = g_slot.shape[0] - 1
    k = 0
    while k < S[NBATCH]:
        slot = batch[k]
        i = s_req[slot]
        g_generated[i & gmask] += 1
        if rules.tokens_left(np.int64(output[i]), g_generated[i & gmask]) == 0:
            _leave_batch(S, batch, slot)
            _finish(S, slot, i, now_s, output, s_head, s_nblocks, next_block, free_stack, free_slots, g_slot,
                    log_finish, log_done, events)
        else:
            k += 1
    for k in range(S[P_NPF]):
        slot = prefilled[k]
        i = s_req[slot]
        g_generated[i & gmask] += 1
        j = i - S[LOG_BASE]
        if math.isnan(log_first[j]):
            log_first[j] = now_s
        if rules.tokens_left(np.int64(output[i]), g_generated[i & gmask]) == 0:  # one output token: done
            _finish(S, slot, i, now_s, output, s_head, s_nblocks, next_block, free_stack, free_slots, g_slot,
                    log_finish, log_done, events)
        else:
            batch[S[NBATCH]] = slot
            S[NBATCH] += 1


@njit(cache=True)
def _finish(S, slot, i, now_s, output, s_head, s_nblocks, next_block, free_stack, free_slots, g_slot, log_finish,
            log_done, events):
    """Request i generated its last token: its blocks go back and its row is done (`RequestLog.finished`)."""
    _free_seq(S, slot, s_head, s_nblocks, next_block, free_stack, free_slots)
    S[RUNNING_SEQS] -= 1
    g_slot[i & (g_slot.shape[0] - 1)] = -1
    log_finish[i - S[LOG_BASE]] = now_s
    S[NUM_FINISHED] += 1
    S[GENERATED_TOKENS] += output[i]
    _event(S, events, i, FINISHED, 0, 0)
    _log_done(S, log_done, i)


@njit(cache=True)
def _record(S, C, now_s, dt_s, rows_f, rows_i):
    """The step's row (`Replica._record`): INT_STEP_COLUMNS of workbench.results, from the plan in S."""
    r = S[ROWS]
    rows_f[r, 0], rows_f[r, 1], rows_f[r, 2] = now_s, dt_s, 0.0
    free = S[P_FREE_SLOTS]
    written, reserved = S[P_TOKEN_SLOTS], S[P_RESERVED]
    row = rows_i[r]
    row[0], row[1], row[2] = S[STEP] - 1, S[P_NUM_DECODE] + S[P_NPF], S[NWAIT]
    row[3], row[4], row[5], row[6] = S[P_NUM_PREFILL], S[P_NUM_DECODE], written, reserved
    row[7], row[8], row[9] = C[CAPACITY_SLOTS] - free - written - reserved, 0, 0  # internal fragmentation
    row[10], row[11], row[12] = free, written, 4 * S[P_TABLE_ENTRIES]  # an int32 block id per table entry
    row[13], row[14], row[15], row[16], row[17] = 0, S[P_PREEMPTIONS], 0, free, S[P_UNSHARED_SLOTS]
    S[ROWS] = r + 1
