"""The step loop of a plain `paged`, `paged-prefix` or `virtual-contiguous` run, compiled with Numba
(workbench.engine.compiled_paged).

It is `Replica.step` with the `Scheduler`, `Admission` and `CostMeter` calls of a plain run written out, in
the same order, over arrays: arrivals join the waiting queue (or are rejected), the decode batch appends one
slot per sequence (preempting the latest-arrived group while it cannot), then — unless something was
preempted — waiting groups are admitted first come first served, the clock prices the step, prefilled groups
produce their first token and join the batch, finished groups give their blocks back, and one step row is
written. The pool is the strategy's own (workbench.allocators.paged.compiled_pool): a sequence is a row of its
tables, and blocks are taken, appended and given back by the functions of `paged.loops` that its verbs call.
Where the pool holds a hash-chain prefix cache (workbench.allocators.prefix.compiled_cache), the prompt's keys,
hits, placement, the decode append and the release are that strategy's one-call verbs (`prefix_verbs`, over the
arrays of the tuple `X`); without one `X` is None, and Numba compiles the loop without those branches (its
branch pruning of `X is None`), so a plain pool's loop carries none of the cache's code. A `virtual-contiguous`
pool (workbench.allocators.virtual.compiled_pool) is the tuple `V` instead: a row's sequence lives in an extent
whose pages the strategy's page-pool functions take, open and release (`extent_verbs`), the block arrays are
unused stand-ins, and the step's cost adds the pages mapped since the last step.

The loop stops and returns to the caller (`run_steps`' status) whenever it needs something only Python has
or an output buffer is full; every state it stops in is one it can resume from:
  DONE         every request is finished or rejected
  ROWS_FULL    the step-row buffer is full (the caller hands the rows on and resets S[ROWS])
  EVENTS_FULL  the buffer of finished and rejected requests may not hold this step's (the caller logs them and
               resets S[EVENTS], or grows the buffer when it is already empty)
  GROW         the next arrival needs a larger request window or waiting ring
  GROW_ROWS    an admission needs a row and none is free (the caller doubles the rows, as `SeqRows.add` would)
  WIDEN        a table needs S[NEED_COLS] columns, more than the pool has (the caller widens them, as
               `BlockTables` would)
  NEED_CLOCK   the step is planned and the clock's per-row tables lack the entries `need` names
               (workbench.clock.step_formula; the caller fills them from the clock)
  STUCK        work is left that can never run (the caller raises, as `Replica.step` does)
  GROW_KEYS    the prefix cache's key table needs room for S[NEED_KEYS] more keys (the caller grows it, as
               `HashPrefixIndex.insert` would; nothing of the verb that asked is done yet)

The verdicts (arrival, admission, the victim, finishing, a step that cannot run) are workbench.engine.rules'
(compiled: workbench.engine.compiled_rules) and the step's duration is workbench.clock.step_formula's, the same
functions the general loop calls; no fastmath, so the step times are the same doubles.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from workbench.allocators.paged import loops, pool_counts
from workbench.allocators.paged.block_stack import pop_blocks, push_blocks
from workbench.allocators.paged.pool_counts import ENTRIES, LOGICAL, WRITTEN
from workbench.clock import step_formula
from workbench.engine import compiled_rules as rules
from workbench.engine.compiled_paged import extent_verbs as ext
from workbench.engine.compiled_paged import prefix_verbs as prefix

# statuses
DONE, ROWS_FULL, EVENTS_FULL, GROW, NEED_CLOCK, STUCK, GROW_ROWS, WIDEN, GROW_KEYS = 0, 1, 2, 3, 4, 5, 6, 7, 8

# S: the loop's integer state, int64 [NUM_STATE]
(NEXT_ARRIVAL, STEP, NBATCH, WAIT_HEAD, NWAIT, RUNNING_SEQS, FREE_TOP, FREE_ROWS_TOP, PHASE, ROWS, EVENTS,
 LOG_BASE, LOG_READY, NUM_FINISHED, NUM_REJECTED, GENERATED_TOKENS, NEED_COLS, REJECTED_BEFORE,
 BUDGET,
 # the step being planned: its cost and its snapshot
 P_NUM_DECODE, P_NPF, P_NUM_PREFILL, P_KV_READ, P_ATTN_CTX, P_DECODE_CTX, P_DECODE_BLOCKS, P_UNSHARED_SLOTS,
 P_PREEMPTIONS, P_TOKEN_SLOTS, P_LOGICAL_SLOTS, P_RESERVED, P_FREE_SLOTS,
 # a prefix cache's: keys in its table, keys a verb waits room for, the strategy's counters (prompt tokens
 # queried, tokens hit, blocks evicted), the step's copies and cached slots
 NUM_KEYS, NEED_KEYS, QUERIED, HIT, EVICTED, P_COPIES, P_CACHED_SLOTS,
 # the step's internal fragmentation and block-table bytes, `virtual-contiguous`'s pages mapped this step, and
 # its pages ever mapped at the last plan
 P_INTERNAL, P_TABLE_BYTES, P_MAPPED, MAPPED_REPORTED, NUM_STATE) = range(44)

# S[PHASE]: where the step stands, so that a stop inside it resumes there
START, APPEND, ADMIT, DECIDE, PLANNED = 0, 1, 2, 3, 4

# C: the run's integer constants, int64 [NUM_CONSTS]
BLOCK_SIZE, MAX_MODEL_LEN, MAX_NUM_SEQS, MAX_BATCHED, WATERMARK, CAPACITY_SLOTS, NUM_CONSTS = range(7)

# why a request ended (the event buffer's code column; workbench.engine.compiled_paged.drive words them)
FINISHED, REJECT_TOO_LONG, REJECT_POOL, REJECT_WATERMARK, REJECT_BLOCKS, REJECT_EXTENTS, REJECT_PAGES = range(7)

# step-row columns (INT_STEP_COLUMNS order, workbench.results)
NUM_INT_COLUMNS = 18

# the loop's own steps, called only from compiled code: no wrapper for Python callers is built (less to compile)
_inner = njit(cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)

_TABLE_ENTRY_BYTES = 4  # one int32 block id per table entry (PagedStrategy.snapshot's block_table_bytes)


@_inner
def _log_done(S, log_done, i):
    """Request i is finished or rejected: the done prefix of the request window grows past it."""
    base = S[LOG_BASE]
    log_done[i - base] = True
    if i == S[LOG_READY]:
        k = i - base
        while k < log_done.shape[0] and log_done[k]:
            k += 1
        S[LOG_READY] = base + k


@_inner
def _event(S, events, i, code, a, b):
    e = S[EVENTS]
    events[e, 0], events[e, 1], events[e, 2], events[e, 3] = i, code, a, b
    S[EVENTS] = e + 1


@_inner
def _free_row(S, C, X, V, row, data, length, num_blocks, table, refcount, free_ids, live, free_rows, counts,
              released):
    """The sequence in `row` gives its blocks back (`PagedStrategy.free`: `release_row`, the counters, then the
    released blocks pushed so that its first one is popped first, or handed to the prefix cache; an extent's pages
    with `V`) and its row (`SeqRows.remove`: zeroed, not live, pushed on the free rows)."""
    if V is not None:
        ext.release(V, row)
    else:
        n, written = loops.release_row(row, length, num_blocks, table, refcount, C[BLOCK_SIZE], released)
        pool_counts.released(counts, written, length[row], num_blocks[row])
        if X is not None:
            S[FREE_TOP] = prefix.release(X, released[:n], free_ids, S[FREE_TOP])
        else:
            S[FREE_TOP] = push_blocks(free_ids, S[FREE_TOP], released, n)
    for c in range(data.shape[0]):  # a loop, not a 2-D slice: no view to count references of
        data[c, row] = 0
    live[row] = False
    free_rows[S[FREE_ROWS_TOP]] = row
    S[FREE_ROWS_TOP] += 1


@_inner
def _sole_holders(S, counts, refcount, cached):
    """Whether no held block has two holders (`loops.count_append`'s `sole_holders`). Every held block is a
    table entry of a sequence (no recurrent state or host pool; `cached` blocks are held by none), so as many
    table entries as held blocks means one holder each; a shared block makes them differ."""
    return counts[ENTRIES] == refcount.shape[0] - S[FREE_TOP] - cached


@_inner
def _leave_batch(S, batch, row):
    """The sequence in `row` leaves the decode batch; the others keep their order."""
    n = S[NBATCH]
    k = 0
    while batch[k] != row:
        k += 1
    for m in range(k, n - 1):
        batch[m] = batch[m + 1]
    S[NBATCH] = n - 1


@njit(cache=True)
def run_steps(S, F, C, K, arrival_s, prompt, output, rows_s, flops_per_s, output_s, need, g_generated, g_row, wait,
              row_req, batch, prefilled, free_rows, data, length, final_len, num_blocks, last_block, swapped, mark,
              live, table, refcount, scratch, free_ids, counts, released, slots, copies, log_admitted, log_first,
              log_finish, log_preempt, log_hit, log_done, events, rows_f, rows_i, X, V):
    """Step until a status (module docstring) says to stop. `F[0]` is the replica's clock (s). Per request
    i (ring position i & (len - 1) of `g_generated` and `g_row`): tokens generated, pool row or -1; `wait` a
    ring of request indices (head S[WAIT_HEAD]); per pool row: its request (`row_req`); `batch` the decoding
    rows in join order; `prefilled` this step's admitted rows; `free_rows` the free rows (top S[FREE_ROWS_TOP]);
    `data` .. `counts` the pool's arrays (CompiledPool; `data` holds the per-row columns `length` .. `mark`);
    `released`, `copies` scratch buffers of `release_row` and `decode_append`, `slots` empty (no kernel reads a
    slot mapping); the `log_*` arrays are the RequestLog window (row i - S[LOG_BASE]); `X` a prefix cache's arrays
    (`prefix_verbs`), None without a prefix cache; `V` a `virtual-contiguous` pool's (`extent_verbs`), whose
    rows are `data`'s and `live`'s, the block arrays then unused; None for a block pool."""
    while True:
        if S[PHASE] == START:
            if S[ROWS] == rows_f.shape[0]:
                return ROWS_FULL
            status = _arrive(S, F, C, arrival_s, prompt, output, g_generated, g_row, wait, log_done, events)
            if status >= 0:
                return status
            if S[NBATCH] == 0 and S[NWAIT] == 0:  # every request that arrived now was rejected
                continue
            # a step ends at most every waiting group (rejected, or admitted and done with one token) and every
            # running one (finished, or the one retired)
            if S[EVENTS] + S[NWAIT] + S[RUNNING_SEQS] + 1 > events.shape[0]:
                return EVENTS_FULL
            S[REJECTED_BEFORE], S[P_PREEMPTIONS], S[P_NPF], S[P_COPIES] = S[NUM_REJECTED], 0, 0, 0
            S[PHASE] = APPEND
        if S[PHASE] == APPEND:
            status = _append_or_preempt(S, C, X, V, prompt, g_row, wait, row_req, batch, free_rows, data, length,
                                        final_len, num_blocks, last_block, swapped, mark, live, table, refcount,
                                        scratch, free_ids, counts, released, slots, copies, log_preempt, log_done,
                                        events)
            if status >= 0:
                return status
            S[BUDGET] = C[MAX_BATCHED]
            S[PHASE] = ADMIT if rules.admits_after(S[P_PREEMPTIONS]) else DECIDE
        if S[PHASE] == ADMIT:
            status = _admit(S, F, C, X, V, prompt, output, g_generated, g_row, wait, row_req, prefilled, free_rows,
                            length, final_len, num_blocks, last_block, live, table, refcount, free_ids, counts,
                            log_admitted, log_hit, log_done, events)
            if status >= 0:
                return status
            S[PHASE] = DECIDE
        if S[PHASE] == DECIDE:
            if V is not None:  # `VirtualContiguous.end_step`: the pages mapped since the last step's plan
                mapped_total = ext.mapped_total(V)
                S[P_MAPPED], S[MAPPED_REPORTED] = mapped_total - S[MAPPED_REPORTED], mapped_total
            verdict = rules.step_verdict(S[NBATCH] + S[P_NPF], 0, S[NUM_REJECTED] - S[REJECTED_BEFORE])
            # a step that preempted always runs here (one sequence a group, no partial prefill: each preemption
            # frees a block for the batch left), so no preemption waits for a later row (`Replica`'s carry)
            if verdict != rules.RUN:
                if verdict == rules.STUCK:
                    return STUCK
                S[PHASE] = START
                continue
            _plan(S, C, X, V, length, final_len, num_blocks, last_block, swapped, live, refcount, scratch, counts,
                  batch, prefilled)
            S[PHASE] = PLANNED
        dt_s = step_formula.compute_s(K, rows_s, output_s, flops_per_s, need, S[P_NUM_PREFILL], S[P_NUM_DECODE],
                                      S[P_KV_READ], S[P_ATTN_CTX], S[P_DECODE_CTX], S[P_COPIES], 0, math.nan,
                                      S[P_MAPPED], S[P_DECODE_BLOCKS], S[P_NUM_DECODE] + S[P_NPF])
        if math.isnan(dt_s):
            return NEED_CLOCK
        F[0] += dt_s
        S[STEP] += 1
        _complete(S, C, X, V, F[0], output, g_generated, g_row, row_req, batch, prefilled, free_rows, data, length,
                  num_blocks, table, refcount, free_ids, live, counts, released, log_first, log_finish, log_done,
                  events)
        _record(S, F[0], dt_s, rows_f, rows_i)
        S[PHASE] = START


@_inner
def _arrive(S, F, C, arrival_s, prompt, output, g_generated, g_row, wait, log_done, events):
    """The clock moves to the next event (now while there is work, else the next arrival:
    `Replica.next_event_s`) and the requests that arrived by then join the waiting queue or are rejected
    (`Scheduler.arrive`). Returns DONE when no request is left, GROW when the next arrival needs room,
    else -1. Calling it again at once changes nothing."""
    num_requests = arrival_s.shape[0]
    gmask = g_row.shape[0] - 1
    wcap = wait.shape[0]
    ready = S[NBATCH] > 0 or S[NWAIT] > 0
    left = S[NEXT_ARRIVAL] < num_requests
    if not ready and not left:
        return DONE
    F[0] = rules.next_event_s(F[0], ready, arrival_s[S[NEXT_ARRIVAL]] if left else math.inf)
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
        g_row[i & gmask] = -1
        wait[(S[WAIT_HEAD] + S[NWAIT]) % wcap] = i
        S[NWAIT] += 1
    return -1


@_inner
def _append_or_preempt(S, C, X, V, prompt, g_row, wait, row_req, batch, free_rows, data, length, final_len, num_blocks,
                       last_block, swapped, mark, live, table, refcount, scratch, free_ids, counts, released, slots,
                       copies, log_preempt, log_done, events):
    """The decode batch appends one slot per sequence, all or nothing (`PagedStrategy.append_if_room`'s
    `decode_append`); while the free blocks cannot supply it, the latest-arrived group is preempted for
    recompute (first in line again), or rejected when it is the only one (`Scheduler._grow_batch`), counted in
    S[P_PREEMPTIONS]. Returns WIDEN when a table needs more columns (nothing changed since the last
    preemption) or GROW_KEYS when a prefix cache's table lacks room for a key per sequence, else -1. With a
    prefix cache the batch appends its generated tokens and registers the blocks they fill (the one-call
    `append_if_room`). The batch is this loop's own rows: each joins once with its first token, leaves with its
    last (or preempted) and is never swapped out, so `batch_check` holds by construction and is not made in the
    plain pool's append (the tests compare every step with the general loop's, whose strategy checks it)."""
    gmask = g_row.shape[0] - 1
    wcap = wait.shape[0]
    while S[NBATCH] > 0:
        rows = batch[:S[NBATCH]]
        if V is not None:
            if ext.append(V, rows):
                return -1
        else:
            if X is not None:
                if not prefix.has_room(X[prefix.SLOT_KEY], S[NUM_KEYS], rows.shape[0]):
                    S[NEED_KEYS] = rows.shape[0]
                    return GROW_KEYS
                status, x, from_free, evicted, num_copies, copied_slots, grown, keys_delta = prefix.append(
                    X, rows, row_req, prompt, length, final_len, num_blocks, swapped, last_block, table, refcount,
                    C[BLOCK_SIZE], scratch, mark, free_ids, S[FREE_TOP], slots, copies)
                if status == loops.APPENDED:
                    S[FREE_TOP] -= from_free
                    S[EVICTED] += evicted
                    S[NUM_KEYS] += keys_delta
                    S[P_COPIES] += num_copies
            else:
                status, x, num_copies, copied_slots, grown = loops.decode_append(
                    rows, length, final_len, num_blocks, swapped, last_block, table, refcount, C[BLOCK_SIZE], scratch,
                    mark, free_ids, S[FREE_TOP], slots, copies, _sole_holders(S, counts, refcount, 0), False)
                if status == loops.APPENDED:
                    S[FREE_TOP] -= x
                    S[P_COPIES] += num_copies
            if status == loops.APPENDED:
                pool_counts.appended(counts, rows.shape[0], copied_slots, grown)
                return -1
            if status == loops.WIDEN:
                S[NEED_COLS] = x
                return WIDEN
        victim = batch[rules.victim(row_req[rows])]
        i = row_req[victim]
        last_one = rules.retires_victim(S[NBATCH])
        _leave_batch(S, batch, victim)
        S[RUNNING_SEQS] -= 1
        _free_row(S, C, X, V, victim, data, length, num_blocks, table, refcount, free_ids, live, free_rows, counts,
                  released)
        g_row[i & gmask] = -1
        if last_one:  # the only holder of the pool cannot grow
            S[NUM_REJECTED] += 1
            _event(S, events, i, REJECT_POOL, 0, 0)
            _log_done(S, log_done, i)
        else:
            log_preempt[i - S[LOG_BASE]] += 1
            S[WAIT_HEAD] = (S[WAIT_HEAD] - 1) % wcap
            wait[S[WAIT_HEAD]] = i
            S[NWAIT] += 1
            S[P_PREEMPTIONS] += 1
    return -1


@_inner
def _admit(S, F, C, X, V, prompt, output, g_generated, g_row, wait, row_req, prefilled, free_rows, length,
           final_len, num_blocks, last_block, live, table, refcount, free_ids, counts, log_admitted, log_hit, log_done,
           events):
    """Waiting groups are admitted first come first served under the token budget, max_num_seqs and the
    watermark, each taking the blocks of its prompt and what it generated before a preemption
    (`Admission.admit`; `PagedStrategy.admit`: blocks in the stack's pop order, one holder each, a new row of the
    tables; with a prefix cache its hits first, `_count_admission` and the one-call `_place_admission`; with `V`
    `VirtualContiguous.admit`'s extent and pages); a group the empty pool cannot place is rejected. The admitted
    ones' rows go to `prefilled` (S[P_NPF] of them, their cached tokens in the prefix arrays' PREFILL_CACHED), the
    budget left stays in S[BUDGET]. Returns GROW_ROWS, WIDEN or GROW_KEYS when the next admission needs a row,
    table columns or key slots the pool lacks (nothing of it done yet), else -1."""
    bs = C[BLOCK_SIZE]
    gmask = g_row.shape[0] - 1
    wcap = wait.shape[0]
    while S[NWAIT] > 0:
        budget = S[BUDGET]
        i = wait[S[WAIT_HEAD]]
        tokens = rules.recompute_tokens(np.int64(prompt[i]), g_generated[i & gmask])
        need = rules.blocks_needed(tokens, bs, 1)
        cached = 0  # blocks the prefix cache keeps
        if X is not None:
            cached = prefix.cached_blocks(X[prefix.ENDS])
        allocatable = S[FREE_TOP] + cached  # the strategy's `num_allocatable_blocks`
        if V is not None:
            allocatable = ext.allocatable_slots(V)
        verdict = rules.admission_verdict(tokens, budget, True, S[RUNNING_SEQS], 1, C[MAX_NUM_SEQS], need,
                                          allocatable, C[WATERMARK])
        if verdict == rules.STOP:
            break
        refusal = -1
        num_full = num_hit = revived = fresh = 0
        why_a = why_b = 0  # the refusal's numbers
        if verdict == rules.BELOW_WATERMARK:
            refusal = REJECT_WATERMARK
        elif V is not None:  # `VirtualContiguous._choose`: an extent, then its pages
            placed, why_a, why_b = ext.choose(V, tokens)
            if placed == ext.NO_EXTENT:
                refusal = REJECT_EXTENTS
            elif placed == ext.NO_PAGES:
                refusal = REJECT_PAGES
        else:
            if X is not None:  # `_count_admission`: the prompt's keys and hits first
                num_full, num_hit, revived = prefix.count_prompt(X, i, tokens, np.int64(prompt[i]), bs, refcount)
            fresh, why_b = pool_counts.admission_blocks_compiled(need, num_hit, allocatable, revived)
            if fresh > why_b:  # PagedStrategy._count_admission's refusal (`blocks_refused`)
                refusal, why_a = REJECT_BLOCKS, fresh
        if refusal >= 0 and not rules.refusal_is_final(S[RUNNING_SEQS]):  # blocks will come free: it waits
            break
        if refusal < 0 and S[FREE_ROWS_TOP] == 0:  # `SeqRows.add` grows the rows
            return GROW_ROWS
        if V is None and refusal < 0 and need > table.shape[1]:  # `BlockTables.add` widens the tables
            S[NEED_COLS] = need
            return WIDEN
        if X is not None:
            if refusal < 0 and not prefix.has_room(X[prefix.SLOT_KEY], S[NUM_KEYS], num_full - num_hit):
                S[NEED_KEYS] = num_full - num_hit
                return GROW_KEYS
        S[WAIT_HEAD] = (S[WAIT_HEAD] + 1) % wcap
        S[NWAIT] -= 1
        if refusal >= 0:  # the empty pool cannot place it: nothing ever will
            S[NUM_REJECTED] += 1
            _event(S, events, i, refusal, why_a, why_b)
            _log_done(S, log_done, i)
            continue
        S[FREE_ROWS_TOP] -= 1
        row = free_rows[S[FREE_ROWS_TOP]]
        final = rules.final_kv_len(np.int64(prompt[i]), np.int64(output[i]))
        if V is not None:
            ext.place(V, row, tokens, final)
        elif X is not None:
            from_free, keys_delta = prefix.place(X, row, num_full, num_hit, fresh, tokens, final, refcount, free_ids,
                                                 S[FREE_TOP], table, length, final_len, num_blocks, last_block)
            S[FREE_TOP] -= from_free
            S[NUM_KEYS] += keys_delta
            S[EVICTED] += fresh - from_free
            S[QUERIED] += tokens
            S[HIT] += num_hit * bs
        else:
            blocks = pop_blocks(free_ids, S[FREE_TOP], need)
            for j in range(need):
                refcount[blocks[j]] = 1
            loops.fill_row(row, blocks, tokens, final, table, length, final_len, num_blocks, last_block)
            S[FREE_TOP] -= need
        cached_tokens = num_hit * bs
        live[row] = True
        if V is None:
            pool_counts.added(counts, tokens, 1, need, (num_hit - revived) * bs)  # hits in use were written before
        row_req[row] = i
        g_row[i & gmask] = row
        j = i - S[LOG_BASE]
        log_admitted[j] = rules.first_time(log_admitted[j], F[0])
        log_hit[j] += cached_tokens
        S[RUNNING_SEQS] += 1
        S[BUDGET] = budget - (tokens - cached_tokens)  # the tokens it computes (`Prefill.write_tokens`)
        if X is not None:
            X[prefix.PREFILL_CACHED][S[P_NPF]] = cached_tokens
        prefilled[S[P_NPF]] = row
        S[P_NPF] += 1
    return -1


@_inner
def _plan(S, C, X, V, length, final_len, num_blocks, last_block, swapped, live, refcount, scratch, counts, batch,
          prefilled):
    """The planned step's cost (`CostMeter.cost`) and snapshot (`PagedStrategy.snapshot`: the counters, the
    reserved slots and the cached ones; `VirtualContiguous.snapshot` with `V`), into S. An admitted sequence's
    length is its whole prompt (and recomputed tokens), written this step past its prefix-cache hit."""
    bs = C[BLOCK_SIZE]
    num_decode, npf = S[NBATCH], S[P_NPF]
    decode_ctx = decode_blocks = 0
    for k in range(num_decode):
        if V is not None:  # block size 1: a block per token (CostMeter's count)
            n = ext.length_of(V, batch[k])
            decode_ctx += n
            decode_blocks += n
        else:
            decode_ctx += length[batch[k]]
            decode_blocks += num_blocks[batch[k]]
    num_prefill = prefill_ctx = attn_ctx_prefill = prefill_blocks = 0
    for k in range(npf):
        cached_tokens = 0
        if V is not None:
            tokens = ext.length_of(V, prefilled[k])
            prefill_blocks += tokens
        else:
            tokens = length[prefilled[k]]
            prefill_blocks += num_blocks[prefilled[k]]
        if X is not None:
            cached_tokens = X[prefix.PREFILL_CACHED][k]
        num_prefill += tokens - cached_tokens
        prefill_ctx += tokens
        attn_ctx_prefill += rules.query_keys(cached_tokens, tokens)
    S[P_NUM_DECODE], S[P_NUM_PREFILL] = num_decode, num_prefill
    S[P_KV_READ], S[P_ATTN_CTX] = decode_ctx + prefill_ctx, decode_ctx + attn_ctx_prefill
    S[P_DECODE_CTX], S[P_DECODE_BLOCKS] = decode_ctx, decode_blocks
    if V is not None:
        token, reserved, internal, cached_slots, free_slots, table_bytes = ext.snapshot(V, S[RUNNING_SEQS])
        S[P_TOKEN_SLOTS], S[P_RESERVED], S[P_INTERNAL] = token, reserved, internal
        S[P_LOGICAL_SLOTS], S[P_FREE_SLOTS], S[P_CACHED_SLOTS] = token, free_slots, cached_slots
        S[P_TABLE_BYTES] = table_bytes
        S[P_UNSHARED_SLOTS] = token + reserved + internal  # `Replica._record`: a pool that grows by tokens
        return
    cached = 0
    if X is not None:
        cached = prefix.cached_blocks(X[prefix.ENDS])
    reserved = loops.reserved_slots(live, swapped, length, final_len, num_blocks, last_block, refcount, bs, scratch,
                                    _sole_holders(S, counts, refcount, cached))
    S[P_UNSHARED_SLOTS] = (decode_blocks + prefill_blocks) * bs
    S[P_TOKEN_SLOTS], S[P_RESERVED] = counts[WRITTEN], reserved
    S[P_LOGICAL_SLOTS], S[P_FREE_SLOTS] = counts[LOGICAL], S[FREE_TOP] * bs
    S[P_TABLE_BYTES] = _TABLE_ENTRY_BYTES * counts[ENTRIES]
    S[P_CACHED_SLOTS] = cached * bs
    S[P_INTERNAL] = pool_counts.internal_frag_slots(C[CAPACITY_SLOTS] - S[P_CACHED_SLOTS] - S[P_FREE_SLOTS],
                                                    counts[WRITTEN], reserved, 0)


@_inner
def _complete(S, C, X, V, now_s, output, g_generated, g_row, row_req, batch, prefilled, free_rows, data, length,
              num_blocks, table, refcount, free_ids, live, counts, released, log_first, log_finish, log_done, events):
    """The step ended at `now_s` (`Scheduler.complete`): every decoding sequence produced a token, every
    prefilled one its first and joins the batch, and the groups with all their tokens are freed."""
    gmask = g_row.shape[0] - 1
    k = 0
    while k < S[NBATCH]:
        row = batch[k]
        i = row_req[row]
        g_generated[i & gmask] += 1
        if rules.tokens_left(np.int64(output[i]), g_generated[i & gmask]) == 0:
            _leave_batch(S, batch, row)
            _finish(S, C, X, V, row, i, now_s, output, g_row, free_rows, data, length, num_blocks, table, refcount,
                    free_ids, live, counts, released, log_finish, log_done, events)
        else:
            k += 1
    for k in range(S[P_NPF]):
        row = prefilled[k]
        i = row_req[row]
        g_generated[i & gmask] += 1
        j = i - S[LOG_BASE]
        log_first[j] = rules.first_time(log_first[j], now_s)
        if rules.tokens_left(np.int64(output[i]), g_generated[i & gmask]) == 0:  # one output token: done
            _finish(S, C, X, V, row, i, now_s, output, g_row, free_rows, data, length, num_blocks, table, refcount,
                    free_ids, live, counts, released, log_finish, log_done, events)
        else:
            batch[S[NBATCH]] = row
            S[NBATCH] += 1


@_inner
def _finish(S, C, X, V, row, i, now_s, output, g_row, free_rows, data, length, num_blocks, table, refcount, free_ids,
            live, counts, released, log_finish, log_done, events):
    """Request i generated its last token: its blocks go back and its row is done (`RequestLog.finished`)."""
    _free_row(S, C, X, V, row, data, length, num_blocks, table, refcount, free_ids, live, free_rows, counts, released)
    S[RUNNING_SEQS] -= 1
    g_row[i & (g_row.shape[0] - 1)] = -1
    log_finish[i - S[LOG_BASE]] = now_s
    S[NUM_FINISHED] += 1
    S[GENERATED_TOKENS] += output[i]
    _event(S, events, i, FINISHED, 0, 0)
    _log_done(S, log_done, i)


@_inner
def _record(S, now_s, dt_s, rows_f, rows_i):
    """The step's row (`Replica._record`): INT_STEP_COLUMNS of workbench.results, from the plan in S."""
    r = S[ROWS]
    rows_f[r, 0], rows_f[r, 1], rows_f[r, 2] = now_s, dt_s, 0.0
    free, cached = S[P_FREE_SLOTS], S[P_CACHED_SLOTS]
    written, reserved = S[P_TOKEN_SLOTS], S[P_RESERVED]
    row = rows_i[r]
    row[0], row[1], row[2] = S[STEP] - 1, S[P_NUM_DECODE] + S[P_NPF], S[NWAIT]
    row[3], row[4], row[5], row[6] = S[P_NUM_PREFILL], S[P_NUM_DECODE], written, reserved
    row[7], row[8], row[9] = S[P_INTERNAL], cached, 0
    row[10], row[11], row[12] = free, S[P_LOGICAL_SLOTS], S[P_TABLE_BYTES]
    row[13], row[14], row[15], row[16], row[17] = S[P_COPIES], S[P_PREEMPTIONS], 0, free, S[P_UNSHARED_SLOTS]
    S[ROWS] = r + 1
