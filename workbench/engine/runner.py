"""The kernels in the engine's loop: one step's block moves, cache writes, attention and verification.

Runs only when a kernel backend is chosen. Per sequence it keeps the running prefix hash of the rows
written (an array indexed by sequence id), so a decode step's new K/V rows are computed for the
whole batch at once. Verification rebuilds a sequence's K/V from its logical token ids
alone (prompt + generated) and compares the kernel's output with the float64 reference.
"""

from __future__ import annotations

import time

import numpy as np

from workbench import kernels
from workbench.allocators.values import PagedDescriptor
from workbench.engine.kvpool import KVContent, KVPool, content_terms, prefix_sums
from workbench.engine.latent import LatentKernel, top_k_positions
from workbench.engine.latent import prepare_decode as prepare_latent_decode
from workbench.engine.latent import reference_decode as latent_reference
from workbench.engine.plan import SeqWrite, StepPlan
from workbench.engine.tokens import TokenStore
from workbench.kernels import mla, reference
from workbench.splitmix import mix64

# sequences checked at a verification step, chosen by a draw seeded with (seed, step): the reference
# rebuilds each one's K/V from scratch, so checking a whole large batch would dwarf the kernel
VERIFY_DECODE_SEQS = 8
VERIFY_EXTEND_SEQS = 2
_Q_TABLE_ROWS = 4096
_Q_SCALE = 8.0  # query magnitude: softmax scores with std ~2, so attention is selective, not a mean
_SEQ_MUL, _POS_MUL, _STEP_MUL = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F),
                                 np.uint64(0x165667B19E3779F9))


def _run_prepared(dec, ext_in):
    """Runs a step's prepared attention calls: (decode (q, out) or None, extend (q, qo_indptr, out) or None)."""
    dec_out = None if dec is None else (dec[0], dec[1]())
    ext_out = None if ext_in is None else (ext_in[0], ext_in[1], ext_in[2]())
    return dec_out, ext_out


class VerificationError(AssertionError):
    """The kernel's output differs from the reference recomputed from the logical tokens."""


def tolerance(kv_dtype: str) -> float:
    return 1e-5 if kv_dtype == "fp32" else 1e-2


class KernelRunner:
    """Executes a StepPlan on the KV pool. Mutates the pool and its own per-sequence hash sums; reads the
    token store (for the logical tokens it rebuilds K/V from) and nothing else of the scheduler."""

    def __init__(self, pool: KVPool, tokens: TokenStore, *, block_size: int, num_q_heads: int, head_dim: int,
                 seed: int, verify_every: int, latent: LatentKernel | None = None) -> None:
        """`latent`: a latent KV layout (workbench.engine.latent): the pool holds one row of its width per slot,
        decode attention runs the latent kernel and prefills write their rows without an attention kernel."""
        self.pool = pool
        self.tokens = tokens
        self.block_size = block_size
        self.backend = pool.backend
        self.kv_dtype = pool.kv_dtype
        self.latent = latent
        if latent is not None:
            head_dim = latent.row_width
        num_kv_heads = pool.k.shape[1]
        self.content = KVContent(num_kv_heads, head_dim, pool.kv_dtype)
        self.num_q_heads = num_q_heads
        self.head_dim = head_dim
        self.scale = 1.0 / np.sqrt(head_dim) if latent is None else latent.scale
        self.seed = seed
        self.verify_every = verify_every
        rng = np.random.default_rng(seed ^ 0x51)
        self.q_table = ((rng.random((_Q_TABLE_ROWS, head_dim), dtype=np.float32) * 2 - 1) * _Q_SCALE)  # [E, D]
        self.acc = np.zeros(1024, dtype=np.uint64)  # [max_seq_id] prefix-hash sum of the rows written
        self.kernel_time_s = 0.0
        self.kernel_bytes = 0
        self.verify_max_rel_err = 0.0  # the largest seen; 0 until a sequence is verified

    def _ensure(self, seq_id: int) -> None:
        if seq_id >= self.acc.shape[0]:
            grow = max(seq_id + 1, 2 * self.acc.shape[0]) - self.acc.shape[0]
            self.acc = np.concatenate([self.acc, np.zeros(grow, dtype=np.uint64)])

    # ---- one step ----------------------------------------------------------------------------
    def run(self, plan: StepPlan) -> float | None:
        """Mutates the pool. Returns the attention wall time of this step (None when it ran none)."""
        self.move(plan)
        kernel = plan.kernel
        extend = self._write_prefills(kernel.writes, [g.write_slots for g in kernel.groups])
        dec_ids = kernel.decode_seq_ids
        if len(dec_ids):
            self._write_decodes(dec_ids, kernel.decode_positions, kernel.decode_token_ids,
                                [g.decode_slots for g in kernel.groups])
        if not kernel.attention:
            return None
        if self.latent is not None:  # one layer group, read by the latent decode kernel
            return self._latent_decode(plan.step, dec_ids, kernel.decode_positions, kernel.groups[0].decode_desc)
        weighted_s = 0.0
        for group in kernel.groups:  # each layer group's attention over its own table, with its window
            window = group.window_tokens
            dec = self._decode_launch(dec_ids, kernel.decode_positions, group.decode_desc, plan.step, window) \
                if len(dec_ids) else None
            ext_in = self._extend_launch(extend, group.extend_desc, plan.step, window) if extend else None
            # only the kernels are timed: checks, plans, queries and transfers are done before
            (dec_out, ext_out), elapsed = self._timed(_run_prepared, dec, ext_in)
            self.kernel_time_s += elapsed
            weighted_s += group.layer_frac * elapsed  # a group's kernel stands for its share of the layers
            if self.verify_every and plan.step % self.verify_every == 0:
                self._verify(plan.step, dec_ids, kernel.decode_positions, dec_out, extend, ext_out, window)
        return weighted_s

    def move(self, plan: StepPlan) -> None:
        """Mutates the pool. The plan's block movements: beam forks, swaps, tier moves and copy-on-write copies.
        A step that does not run (`rules.step_verdict`: nothing computes) makes them too: what it swapped out
        or evicted to a tier must be there when it comes back."""
        pool, bs, effects = self.pool, self.block_size, plan.effects
        for parent, child in plan.forks:
            self._ensure(child)
            self.acc[child] = self.acc[parent]
        if len(plan.swap_out):
            pool.swap_out(plan.swap_out, bs)
        if len(effects.unmapped):  # after the swap-outs read them, before anything maps pages again
            pool.release(effects.unmapped)
        if len(effects.shared_spill):  # host-tier drops, before the demotes below overwrite their host blocks
            pool.spill_shared(effects.shared_spill, bs)
        if len(effects.demote):  # before anything of the step writes the device blocks it reads
            pool.demote(effects.demote, bs)
        if len(effects.shared_demote):
            pool.demote_shared(effects.shared_demote, bs)
        if len(effects.promote):
            pool.promote(effects.promote, bs)
        if len(effects.shared_promote):
            pool.promote_shared(effects.shared_promote, bs)
        if len(plan.swap_in):
            pool.swap_in(plan.swap_in, bs)
        if len(plan.copies):
            pool.copy_blocks(plan.copies, bs)

    def _write_prefills(self, writes: tuple[SeqWrite, ...], group_write_slots: list[tuple[np.ndarray, ...]]
                        ) -> list[SeqWrite]:
        """Write every admitted sequence's rows [start, stop) into each layer group's slots
        (`group_write_slots`, one tuple per group); returns the writes with extend queries."""
        k_parts, v_parts = [], []
        for w in writes:
            self._ensure(w.seq_id)
            tokens = self.tokens.logical(w.seq_id, w.stop)
            sums = prefix_sums(content_terms(tokens, np.arange(w.stop)))  # [stop]
            self.acc[w.seq_id] = sums[-1]
            k, v = self.content.model_rows(sums[w.start:])
            k_parts.append(k)
            v_parts.append(v)
        if k_parts:
            k_all, v_all = np.concatenate(k_parts), np.concatenate(v_parts)
            # every sequence's rows go through its own slot mapping: a shared block's slot comes up
            # once per holder with identical rows (same prefix) and is written once
            for parts in group_write_slots:
                slots = np.concatenate(parts)
                keep = np.unique(slots, return_index=True)[1]  # a shared slot once (its rows are identical)
                self.pool.write(slots[keep], k_all[keep], v_all[keep])
        return [w for w in writes if w.query_start < w.stop]

    def _write_decodes(self, dec_ids: np.ndarray, positions: np.ndarray, token_ids: np.ndarray,
                       slot_sets: list[np.ndarray]) -> None:
        """The decode tokens' rows, written into each of `slot_sets` (int64 [num_decode] per layer group)."""
        with np.errstate(over="ignore"):
            acc = self.acc[dec_ids] + content_terms(token_ids, positions)
        self.acc[dec_ids] = acc
        k, v = self.content.model_rows(acc)
        for slots in slot_sets:
            self.pool.write(slots, k, v)

    # ---- attention ---------------------------------------------------------------------------
    def _queries(self, seq_ids: np.ndarray, positions: np.ndarray, step: int) -> np.ndarray:
        """Deterministic queries, float32 [len(seq_ids), num_q_heads, head_dim]."""
        heads = np.arange(self.num_q_heads, dtype=np.uint64)
        with np.errstate(over="ignore"):
            base = (seq_ids.astype(np.uint64) * _SEQ_MUL ^ positions.astype(np.uint64) * _POS_MUL
                    ^ np.uint64(step) * _STEP_MUL ^ np.uint64(self.seed))
            h = mix64(base[:, None] + heads[None, :])  # [S, Hq]
        return np.ascontiguousarray(self.q_table[(h % np.uint64(_Q_TABLE_ROWS)).astype(np.intp)])

    def _launch(self, desc, q: np.ndarray, qo_indptr: np.ndarray | None, window: int):
        """The attention call for one batch (decode when `qo_indptr` is None, else extend; `window` 0 or a
        sliding window), ready to run: host->device conversions, input checks and launch plans happen here,
        outside the timed region. Counts the KV bytes read."""
        pool, xp, backend, kv_dtype = self.pool, self.pool.xp, self.backend, self.kv_dtype
        qd = xp.asarray(q)
        qo = None if qo_indptr is None else xp.asarray(qo_indptr)
        if isinstance(desc, PagedDescriptor):
            fn = kernels.paged_decode if qo is None else kernels.paged_extend
            table = (xp.asarray(desc.kv_indptr), xp.asarray(desc.kv_indices), xp.asarray(desc.kv_last_page_len),
                     desc.block_size)
            kv_len = kernels.paged_kv_len(desc.kv_indptr, desc.kv_last_page_len, desc.block_size)
        else:
            fn = kernels.contiguous_decode if qo is None else kernels.contiguous_extend
            table = (xp.asarray(desc.kv_start), xp.asarray(desc.kv_len))
            kv_len = desc.kv_len
        queries = (qd,) if qo is None else (qd, qo)
        call = kernels.prepare(fn, *queries, pool.k, pool.v, *table, backend=backend, kv_dtype=kv_dtype, window=window)
        if window:  # a windowed query reads at most `window` rows
            kv_len = np.minimum(kv_len, window)
        self.kernel_bytes += kernels.kv_bytes_read(kv_len, pool.k.shape[1], self.head_dim, kv_dtype)
        return call

    def _decode_launch(self, dec_ids: np.ndarray, positions: np.ndarray, desc, step: int, window: int):
        q = self._queries(dec_ids, positions, step)
        return q, self._launch(desc, q, None, window)

    def _extend_launch(self, extend: list[SeqWrite], desc, step: int, window: int):
        q_seq = np.concatenate([np.full(w.stop - w.query_start, w.seq_id, dtype=np.int64) for w in extend])
        q_pos = np.concatenate([np.arange(w.query_start, w.stop, dtype=np.int64) for w in extend])
        qo_indptr = np.zeros(len(extend) + 1, dtype=np.int32)
        qo_indptr[1:] = np.cumsum([w.stop - w.query_start for w in extend])
        q = self._queries(q_seq, q_pos, step)
        return q, qo_indptr, self._launch(desc, q, qo_indptr, window)

    def _latent_decode(self, step: int, dec_ids: np.ndarray, positions: np.ndarray, desc) -> float:
        """The decode batch's latent attention (over its top-k positions under sparse attention), timed, counted
        and verified like the per-head kernels; returns its time (0.0 without decodes)."""
        if not len(dec_ids):
            return 0.0
        latent = self.latent
        kv_lens = positions + 1
        q = self._queries(dec_ids, positions, step)
        selected = (top_k_positions(dec_ids, kv_lens, latent.index_topk, step, self.seed) if latent.index_topk
                    else None)
        call = prepare_latent_decode(latent, desc, self.pool, q, selected, self.backend, self.kv_dtype)
        attended = kv_lens if selected is None else np.diff(selected[0])
        self.kernel_bytes += mla.mla_bytes_read(attended, latent.kv_lora_rank, latent.qk_rope_head_dim, self.kv_dtype)
        out, elapsed = self._timed(call)
        self.kernel_time_s += elapsed
        if self.verify_every and step % self.verify_every == 0:
            out = self._host(out)
            rng = np.random.default_rng((self.seed, step))
            for i in rng.permutation(len(dec_ids))[:VERIFY_DECODE_SEQS]:
                seq_id, length = int(dec_ids[i]), int(kv_lens[i])
                rows, _ = self._reference_rows(seq_id, length)
                chosen = None if selected is None else selected[1][selected[0][i]:selected[0][i + 1]]
                ref = latent_reference(latent, q[i:i + 1], rows, chosen, self.kv_dtype)
                self._check(step, seq_id, out[i:i + 1], ref, "latent decode")
        return elapsed

    def _timed(self, fn, *args):
        """(fn(*args), seconds it took): between CUDA events around it on the GPU (device time of the kernels
        it queues, after everything queued before has finished), wall time on the CPU backends."""
        if self.backend != "cupy":
            t0 = time.perf_counter()
            result = fn(*args)
            return result, time.perf_counter() - t0
        cuda = self.pool.xp.cuda
        cuda.Device().synchronize()  # the step's writes and copies are not the attention's time
        start, stop = cuda.Event(), cuda.Event()
        start.record()
        result = fn(*args)
        stop.record()
        stop.synchronize()
        return result, cuda.get_elapsed_time(start, stop) / 1e3  # ms -> s

    # ---- verification ------------------------------------------------------------------------
    def _reference_rows(self, seq_id: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        tokens = self.tokens.logical(seq_id, length)
        return self.content.rows(prefix_sums(content_terms(tokens, np.arange(length))))

    def _check(self, step: int, seq_id: int, out: np.ndarray, ref: np.ndarray, what: str) -> None:
        err = reference.rel_err(out, ref)
        if not err <= self.verify_max_rel_err:  # NaN-safe running max
            self.verify_max_rel_err = err
        if not err <= tolerance(self.kv_dtype):
            raise VerificationError(
                f"step {step}: request {self.tokens.request_id(seq_id)} (sequence {seq_id}) {what} attention "
                f"differs from the reference recomputed from its logical tokens: rel err {err:.3g} > "
                f"{tolerance(self.kv_dtype):g}")

    def _verify(self, step: int, dec_ids: np.ndarray, positions: np.ndarray, dec_out, extend: list[SeqWrite],
                ext_out, window: int) -> None:
        rng = np.random.default_rng((self.seed, step))
        host = self._host
        if dec_out is not None:
            q, out = dec_out
            out = host(out)
            for i in rng.permutation(len(dec_ids))[:VERIFY_DECODE_SEQS]:
                seq_id, length = int(dec_ids[i]), int(positions[i]) + 1
                k, v = self._reference_rows(seq_id, length)
                ref = reference.contiguous_decode(q[i:i + 1], k, v, np.zeros(1, np.int32),
                                                  np.array([length], np.int32), self.kv_dtype, self.scale,
                                                  window=window)
                self._check(step, seq_id, out[i:i + 1], ref, "decode")
        if ext_out is not None:
            q, qo_indptr, out = ext_out
            out = host(out)
            for j in rng.permutation(len(extend))[:VERIFY_EXTEND_SEQS]:
                seq_id, length = extend[j].seq_id, extend[j].stop
                k, v = self._reference_rows(seq_id, length)
                lo, hi = int(qo_indptr[j]), int(qo_indptr[j + 1])
                ref = reference.contiguous_extend(q[lo:hi], np.array([0, hi - lo], np.int32), k, v,
                                                  np.zeros(1, np.int32), np.array([length], np.int32),
                                                  self.kv_dtype, self.scale, window=window)
                self._check(step, seq_id, out[lo:hi], ref, "extend")

    def _host(self, a) -> np.ndarray:
        return a.get() if self.backend == "cupy" else a
