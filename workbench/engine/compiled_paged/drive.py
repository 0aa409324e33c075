"""Running a plain `paged` replica through its workload with the compiled step loop (workbench.engine.compiled_paged).

`drive` does what `simulation._drive` does — steps until no request is left, hands step rows and done
request rows to the sink in chunks, shows finished requests on a progress bar — with `step_loop.run_steps`
making the steps. Between its calls, Python does what only Python has: the clock's per-row times (into
the replica's own `RooflineClock`'s tables, which the loop's step formula reads as the general loop's does),
the request log's words and its window, and the buffers' growth. A prefix cache's pool
(`CompiledPrefixPool`) adds the workload's prompt segments and the index's arrays (`prefix_verbs`' `X`); a
`virtual-contiguous` pool (`CompiledExtentPool`) lends its extents' and pages' arrays (`extent_verbs`' `V`) and
the loop's block arrays are then empty stand-ins.
"""

from __future__ import annotations

import numpy as np

from workbench import table_sink
from workbench.allocators.prefix.compiled_cache import CompiledPrefixPool
from workbench.allocators.values import blocks_refused
from workbench.allocators.virtual.compiled_pool import PAGE_TOKENS, CompiledExtentPool
from workbench.allocators.virtual.loops import extents_refused, pages_refused
from workbench.engine import reasons
from workbench.engine.compiled_paged import step_loop as L
from workbench.engine.compiled_paged.prompts import prompt_segments
from workbench.engine.request_log import rejected_status
from workbench.results import REQUESTS_TABLE
from workbench.table_sink import TableSink
from workbench.workload.request import RequestColumns

ROWS_PER_CALL = 4096  # step rows the loop buffers before handing them to the step log
FIRST_EVENTS = 4096  # room for finished and rejected requests per call (doubled when a step needs more)

_REASONS = {L.REJECT_POOL: reasons.OUTGROWS_POOL, L.REJECT_WATERMARK: reasons.ABOVE_WATERMARK}

# a pool without blocks (`CompiledExtentPool`) passes these for the loop's block arrays, which it never reads:
# (length, final_len, num_blocks, last_block, swapped, mark, table, refcount, scratch, free_ids, counts, released)
_NO_BLOCKS = (*(np.zeros(1, dtype=np.int64) for _ in range(6)), np.zeros((1, 1), dtype=np.int32),
              np.zeros(1, dtype=np.int32), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int32),
              np.zeros(3, dtype=np.int64), np.zeros(1, dtype=np.int32))


def drive(replica, progress: bool, sink: TableSink) -> None:
    """Mutates `replica` (a workbench.engine.replica.Replica, not imported: the loop sits below it in the
    import graph) — its clock, step log, request log and scheduler counters — and its strategy, whose own arrays
    the loop works on (`Strategy.compiled_pool`), as `simulation._drive` would."""
    from tqdm import tqdm

    run = _Run(replica)
    log, requests = run.log, run.sched.arrivals.requests
    with tqdm(total=len(requests), unit="req", desc="requests", disable=not progress) as bar:
        while (status := run.call()) != L.DONE:
            if status == L.ROWS_FULL:
                run.hand_rows()
            elif status == L.NEED_CLOCK:
                replica.clock.fill(replica.clock.need)
            elif status == L.STUCK:
                raise RuntimeError(reasons.stuck(float(run.F[0]), int(run.S[L.NWAIT]), 0))
            elif status == L.GROW_ROWS:
                run.grow_rows()
            elif status == L.WIDEN:
                run.pool.widen(int(run.S[L.NEED_COLS]))
            elif status == L.GROW_KEYS:
                run.pool.grow_keys(int(run.S[L.NEED_KEYS]))
            else:  # EVENTS_FULL, GROW
                run.grow(status)
            bar.update(run.take_events())
            if log.ready - log.base >= table_sink.ROWS_PER_CHUNK:
                sink.append(REQUESTS_TABLE, log.take_done(requests))
                run.S[L.LOG_BASE] = log.base
        run.hand_rows()
        bar.update(run.take_events())
    run.finish()
    if (rest := log.last_rows(requests)) is not None:
        sink.append(REQUESTS_TABLE, rest)


class _Run:
    """The loop's arrays and the Python side of each stop."""

    def __init__(self, replica) -> None:
        self.replica = replica
        self.sched = sched = replica.scheduler
        self.log = sched.log  # a workbench.engine.request_log.RequestLog
        strategy, clock, cfg = sched.strategy, replica.clock, sched.config
        self.clock = clock
        self.pool = pool = strategy.compiled_pool()
        self.arrival_s, self.prompt, self.output = _columns(sched.arrivals.requests)
        self.S = np.zeros(L.NUM_STATE, dtype=np.int64)
        self.extents = isinstance(pool, CompiledExtentPool)
        self.S[L.FREE_ROWS_TOP] = pool.free_rows_top
        if self.extents:
            self.S[L.MAPPED_REPORTED] = pool.mapped_reported
        else:
            self.S[L.FREE_TOP] = pool.free_size
        self.F = np.zeros(1)
        C = np.zeros(L.NUM_CONSTS, dtype=np.int64)
        C[L.BLOCK_SIZE], C[L.MAX_MODEL_LEN], C[L.MAX_NUM_SEQS] = strategy.block_size, cfg.max_model_len, \
            cfg.max_num_seqs
        C[L.MAX_BATCHED], C[L.WATERMARK] = cfg.max_num_batched_tokens, sched.admission.watermark_blocks
        C[L.CAPACITY_SLOTS] = strategy.capacity_slots
        self.prefix = isinstance(pool, CompiledPrefixPool)
        self.C = C
        if self.prefix:
            self.segments = tuple(prompt_segments(sched.arrivals.requests))
            self.S[L.NUM_KEYS] = pool.num_keys
            most_blocks = cfg.max_model_len // strategy.block_size + 1
            # a prompt's token ids, keys and hits; per row, its cached tokens when admitted this step
            self.prompt_scratch = (np.zeros(cfg.max_model_len + 1, dtype=np.int32),
                                   np.zeros(most_blocks, dtype=np.uint64), np.zeros(most_blocks, dtype=np.int32))
            self.prefill_cached = np.zeros(pool.capacity_rows, dtype=np.int64)
        ring = _pow2(max(1024, self.log.done.shape[0]))
        self.g_generated = np.zeros(ring, dtype=np.int64)
        self.g_row = np.full(ring, -1, dtype=np.int64)
        self.wait = np.zeros(ring, dtype=np.int64)
        # per pool row (they grow with the pool's rows): its request, the decode batch, this step's admitted
        # rows, and decode_append's copies; no slot mapping (empty: no kernel reads one)
        self.row_req, self.batch, self.prefilled = (np.zeros(pool.capacity_rows, dtype=np.int64) for _ in range(3))
        self.slots = np.zeros(0, dtype=np.int64)
        self.copies = np.zeros((pool.capacity_rows, 2), dtype=np.int32)
        self.events = np.zeros((FIRST_EVENTS, 4), dtype=np.int64)
        self.rows_f = np.zeros((ROWS_PER_CALL, 3))
        self.rows_i = np.zeros((ROWS_PER_CALL, L.NUM_INT_COLUMNS), dtype=np.int64)
        self.finished_seen = 0

    def call(self) -> int:
        log, clock, pool = self.log, self.clock, self.pool  # their arrays grow between calls: read them at each
        length, final_len, num_blocks, last_block, swapped, mark, table, refcount, scratch, free_ids, counts, \
            released = self._block_arrays()
        status = L.run_steps(self.S, self.F, self.C, clock.K, self.arrival_s, self.prompt, self.output,
                           clock.rows_s_table, clock.flops_per_s_table, clock.output_s_table, clock.need,
                           self.g_generated, self.g_row, self.wait, self.row_req, self.batch, self.prefilled,
                           pool.free_rows, pool.data, length, final_len, num_blocks, last_block, swapped, mark,
                           pool.live, table, refcount, scratch, free_ids, counts, released, self.slots, self.copies,
                           log.admitted_s, log.first_token_s, log.finish_s, log.num_preemptions,
                           log.prefix_hit_tokens, log.done, self.events, self.rows_f, self.rows_i,
                           self._prefix_arrays(released.shape[0]), pool.views() if self.extents else None)
        if self.prefix:
            pool.keys_changed(int(self.S[L.NUM_KEYS]))
        return status

    def _block_arrays(self) -> tuple:
        """A block pool's per-row columns, tables, refcounts, free stack and counters, and a buffer for a row's
        blocks (as release_row gives them); stand-ins for a pool of extents."""
        if self.extents:
            return _NO_BLOCKS
        pool = self.pool
        c = pool.column
        return (c("length"), c("final_len"), c("num_blocks"), c("last_block"), c("swapped"), c("mark"), pool.table,
                pool.refcount, pool.scratch, pool.free_ids, pool.counts,
                np.empty(pool.table.shape[1], dtype=np.int32))

    def _prefix_arrays(self, num_cols: int) -> tuple | None:
        """`prefix_verbs`' X: the index's arrays, the workload's segments, scratch; None without a prefix cache
        (the loop's other specialization)."""
        if not self.prefix:
            return None
        rows = self.pool.capacity_rows
        return (*self.pool.views(), *self.segments, *self.prompt_scratch, np.zeros(rows, dtype=np.int32),
                self.prefill_cached, np.zeros(num_cols, dtype=np.int32))

    def grow_rows(self) -> None:
        """Twice the pool's rows, and the per-row arrays with them (their values kept)."""
        pool = self.pool
        pool.grow_rows(int(self.S[L.FREE_ROWS_TOP]))
        self.S[L.FREE_ROWS_TOP] = pool.free_rows_top
        for name in ("row_req", "batch", "prefilled") + (("prefill_cached",) if self.prefix else ()):
            old = getattr(self, name)
            new = np.zeros(pool.capacity_rows, dtype=np.int64)
            new[:old.shape[0]] = old
            setattr(self, name, new)
        self.copies = np.zeros((pool.capacity_rows, 2), dtype=np.int32)

    def hand_rows(self) -> None:
        """The buffered step rows go to the replica's step log."""
        n = int(self.S[L.ROWS])
        if n:
            self.replica.steps.record_rows(self.rows_f[:n], self.rows_i[:n])
        self.S[L.ROWS] = 0

    def take_events(self) -> int:
        """Mutates the request log: statuses and counters of the requests the loop ended. Returns how many
        more requests finished."""
        S, log = self.S, self.log
        num = int(S[L.EVENTS])
        status = log.status
        for i, code, a, b in self.events[:num].tolist():
            if code == L.FINISHED:
                status[i - log.base] = "finished"
            elif code == L.REJECT_TOO_LONG:
                status[i - log.base] = rejected_status(reasons.too_long(a, b))
            elif code == L.REJECT_BLOCKS:
                status[i - log.base] = rejected_status(blocks_refused(a, b))
            elif code == L.REJECT_EXTENTS:
                status[i - log.base] = rejected_status(extents_refused(a, 1, b))
            elif code == L.REJECT_PAGES:
                status[i - log.base] = rejected_status(pages_refused(a, int(self.pool.consts[PAGE_TOKENS]), b))
            else:
                status[i - log.base] = rejected_status(_REASONS[code])
        S[L.EVENTS] = 0
        log.ready = int(S[L.LOG_READY])
        log.num_finished, log.num_rejected = int(S[L.NUM_FINISHED]), int(S[L.NUM_REJECTED])
        log.generated_tokens = int(S[L.GENERATED_TOKENS])
        finished, self.finished_seen = log.num_finished - self.finished_seen, log.num_finished
        return finished

    def grow(self, status: int) -> None:
        """Room for the next arrival (GROW) or for a step's ended requests (EVENTS_FULL), before the
        buffered events are taken (the caller takes them next; an empty buffer that is still too small
        doubles)."""
        S, log = self.S, self.log
        if status == L.EVENTS_FULL:
            if S[L.EVENTS] == 0:  # room for one step's ends is more than the whole buffer
                self.events = np.zeros((2 * self.events.shape[0], 4), dtype=np.int64)
            return
        i = int(S[L.NEXT_ARRIVAL])
        log.make_room(i)
        ready = int(S[L.LOG_READY])
        if i - ready >= self.g_row.shape[0] or S[L.NWAIT] == self.wait.shape[0]:
            self._grow_rings(ready, i)

    def _grow_rings(self, ready: int, next_arrival: int) -> None:
        """Double the per-request rings (their live requests keep their values) and the waiting ring."""
        old_mask = self.g_row.shape[0] - 1
        size = 2 * self.g_row.shape[0]
        live = np.arange(ready, next_arrival, dtype=np.int64)
        for name in ("g_generated", "g_row"):
            old = getattr(self, name)
            new = np.zeros(size, dtype=np.int64)
            new[live & (size - 1)] = old[live & old_mask]
            setattr(self, name, new)
        S = self.S
        head, num, wcap = int(S[L.WAIT_HEAD]), int(S[L.NWAIT]), self.wait.shape[0]
        wait = np.zeros(size, dtype=np.int64)
        wait[:num] = self.wait[(head + np.arange(num)) % wcap]
        self.wait = wait
        S[L.WAIT_HEAD] = 0

    def finish(self) -> None:
        """Every request is done: the replica's counters as the general loop leaves them, and the strategy's
        (every block back on its free stack, checked in O(1); the tests check its whole integrity, O(pool))."""
        S, replica = self.S, self.replica
        if self.extents:
            self.pool.finish(int(S[L.FREE_ROWS_TOP]), int(S[L.MAPPED_REPORTED]))
        elif self.prefix:
            self.pool.finish(int(S[L.FREE_TOP]), int(S[L.FREE_ROWS_TOP]), S[[L.QUERIED, L.HIT, L.EVICTED]])
        else:
            self.pool.finish(int(S[L.FREE_TOP]), int(S[L.FREE_ROWS_TOP]))
        replica.now_s = float(self.F[0])
        replica.num_steps = self.sched.step = int(S[L.STEP])
        self.sched.arrivals.skip_to(int(S[L.NEXT_ARRIVAL]))


def _columns(requests) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arrival (s), prompt and output tokens of every request, float64 and int32 arrays [N]: a columns
    workload's own arrays (no copy: a long trace's columns are most of what grows with it). A list of
    requests gives the same dtypes, so the loop is compiled for one signature only."""
    if isinstance(requests, RequestColumns):
        return np.asarray(requests.arrival_s, dtype=np.float64), requests.prompt_tokens, requests.output_tokens
    return (np.array([r.arrival_s for r in requests], dtype=np.float64),
            np.array([r.prompt_tokens for r in requests], dtype=np.int32),
            np.array([r.output_tokens for r in requests], dtype=np.int32))


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()
