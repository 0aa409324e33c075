"""The kernels in the engine's loop: one step's block moves, cache writes, attention and verification.

Runs only when a kernel backend is chosen. Per sequence it keeps the running prefix hash and the
length written (int arrays indexed by sequence id), so a decode step's new K/V rows are computed
for the whole batch at once. Verification rebuilds a sequence's K/V from its logical token ids
alone (prompt + generated) and compares the kernel's output with the float64 reference.
"""

from __future__ import annotations

import time

import numpy as np

from workbench import kernels
from workbench.allocators.base import PagedDescriptor, Strategy
from workbench.groups import Group, StepPlan
from workbench.kernels import reference
from workbench.kvpool import KVContent, KVPool, generated_token_ids, prefix_sums, token_terms
from workbench.workload.request import mix64, output_key, token_ids_for

# sequences checked at a verification step, chosen by a draw seeded with (seed, step): the reference
# rebuilds each one's K/V from scratch, so checking a whole large batch would dwarf the kernel
VERIFY_DECODE_SEQS = 8
VERIFY_EXTEND_SEQS = 2
_Q_TABLE_ROWS = 4096
_Q_SCALE = 8.0  # query magnitude: softmax scores with std ~2, so attention is selective, not a mean
_SEQ_MUL, _POS_MUL, _STEP_MUL = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F),
                                 np.uint64(0x165667B19E3779F9))


class VerificationError(AssertionError):
    """The kernel's output differs from the reference recomputed from the logical tokens."""


def tolerance(kv_dtype: str) -> float:
    return 1e-5 if kv_dtype == "fp32" else 1e-2


class KernelRunner:
    """Executes a StepPlan on the KV pool. Mutates the pool and its own per-sequence arrays."""

    def __init__(self, strategy: Strategy, pool: KVPool, beam_tokens: dict[int, list[int]], *, num_q_heads: int,
                 head_dim: int, seed: int, kernel_every: int, verify_every: int) -> None:
        self.strategy = strategy
        self.beam_tokens = beam_tokens  # the scheduler's: beam sequence id -> generated token ids
        self.pool = pool
        self.backend = pool.backend
        self.kv_dtype = pool.kv_dtype
        num_kv_heads = pool.k.shape[1]
        self.content = KVContent(num_kv_heads, head_dim, pool.kv_dtype)
        self.num_q_heads = num_q_heads
        self.head_dim = head_dim
        self.scale = 1.0 / np.sqrt(head_dim)
        self.seed = seed
        self.kernel_every = kernel_every
        self.verify_every = verify_every
        rng = np.random.default_rng(seed ^ 0x51)
        self.q_table = ((rng.random((_Q_TABLE_ROWS, head_dim), dtype=np.float32) * 2 - 1) * _Q_SCALE)  # [E, D]
        size = 1024
        self.acc = np.zeros(size, dtype=np.uint64)  # [max_seq_id] prefix-hash sum of the rows written
        self.kv_len = np.zeros(size, dtype=np.int64)  # [max_seq_id] rows written
        self.prompt_len = np.zeros(size, dtype=np.int64)
        self.key = np.zeros(size, dtype=np.uint64)  # generated-token segment key of the sequence
        self.request_of = np.zeros(size, dtype=np.int64)
        self.group_of: dict[int, Group] = {}
        self.kernel_time_s = 0.0
        self.kernel_bytes = 0
        self.verify_max_rel_err = float("nan")

    # ---- per-sequence state ------------------------------------------------------------------
    def _ensure(self, seq_id: int) -> None:
        if seq_id >= self.acc.shape[0]:
            grow = max(seq_id + 1, 2 * self.acc.shape[0]) - self.acc.shape[0]
            for name in ("acc", "kv_len", "prompt_len", "key", "request_of"):
                old = getattr(self, name)
                setattr(self, name, np.concatenate([old, np.zeros(grow, dtype=old.dtype)]))

    def logical_tokens(self, seq_id: int, length: int) -> np.ndarray:
        """Token ids of positions [0, length) of the sequence, int32: prompt, then its generated tokens."""
        g = self.group_of[seq_id]
        prompt = g.request.prompt_token_ids()
        p = len(prompt)
        if length <= p:
            return prompt[:length]
        beam = self.beam_tokens.get(seq_id)
        if beam is not None:
            return np.concatenate([prompt, np.asarray(beam[:length - p], dtype=np.int32)])
        return np.concatenate([prompt, token_ids_for(int(self.key[seq_id]), 0, length - p)])

    # ---- one step ----------------------------------------------------------------------------
    def run(self, plan: StepPlan, step: int) -> float | None:
        """Mutates the pool. Returns the attention wall time of this step (None when it ran none)."""
        pool, bs = self.pool, self.strategy.block_size
        for parent, child in plan.forks:
            self._ensure(child)
            for name in ("acc", "kv_len", "prompt_len", "key", "request_of"):
                getattr(self, name)[child] = getattr(self, name)[parent]
            self.group_of[child] = self.group_of[parent]
        for moves in plan.swap_out:
            if len(moves):
                pool.swap_out(moves, bs)
        for moves in plan.swap_in:
            if len(moves):
                pool.swap_in(moves, bs)
        if plan.copies:
            copies = np.concatenate(plan.copies) if len(plan.copies) > 1 else plan.copies[0]
            if len(copies):
                pool.copy_blocks(copies, bs)
        ext = self._write_prefills(plan)
        dec_ids = np.asarray(plan.decode_ids, dtype=np.int64)
        if len(dec_ids):
            self._write_decodes(dec_ids, plan.decode_slots)
        if step % self.kernel_every:
            return None
        dec = self._decode_launch(plan.decode_ids, dec_ids, step) if len(dec_ids) else None
        ext_in = self._extend_launch(ext, step) if ext[0] else None
        # only the kernels are timed: descriptors, queries and transfers are ready before t0
        self._sync()
        t0 = time.perf_counter()
        dec_out = None if dec is None else (dec[0], dec[1]())
        ext_out = None if ext_in is None else (ext_in[0], ext_in[1], ext_in[2]())
        self._sync()
        elapsed = time.perf_counter() - t0
        self.kernel_time_s += elapsed
        if self.verify_every and step % self.verify_every == 0:
            self._verify(step, dec_ids, dec_out, ext, ext_out)
        return elapsed

    def _write_prefills(self, plan: StepPlan) -> tuple[list[int], list[int], list[int]]:
        """Write every admitted sequence's rows [cached, kv_len); returns the extend batch
        (sequence ids, first query position, kv_len) — the group's first sequence over the prompt,
        the others over their own recomputed tokens."""
        ext_ids: list[int] = []
        ext_start: list[int] = []
        ext_len: list[int] = []
        slots_parts, k_parts, v_parts = [], [], []
        for p in plan.prefills:
            g = p.group
            req = g.request
            prompt_len = req.prompt_tokens
            for sample, seq_id in enumerate(g.seq_ids):
                self._ensure(seq_id)
                self.group_of[seq_id] = g
                self.key[seq_id] = output_key(req.request_id, sample)
                self.prompt_len[seq_id] = prompt_len
                self.request_of[seq_id] = req.request_id
                tokens = self.logical_tokens(seq_id, g.kv_len)
                sums = prefix_sums(token_terms(tokens, np.arange(g.kv_len)))  # [kv_len]
                self.acc[seq_id] = sums[-1]
                self.kv_len[seq_id] = g.kv_len
                # every sequence's rows go through its own slot mapping: a shared block's slot comes up
                # once per holder with identical rows (same prefix) and is written once
                slots_parts.append(self.strategy.slot_mapping(seq_id, p.cached_tokens, g.kv_len))
                k, v = self.content.rows(sums[p.cached_tokens:])
                k_parts.append(k)
                v_parts.append(v)
                start = p.cached_tokens if sample == 0 else prompt_len
                if start < g.kv_len:
                    ext_ids.append(seq_id)
                    ext_start.append(start)
                    ext_len.append(g.kv_len)
        if slots_parts:
            slots = np.concatenate(slots_parts)
            keep = np.unique(slots, return_index=True)[1]  # a shared slot once (its rows are identical)
            self.pool.write(slots[keep], np.concatenate(k_parts)[keep], np.concatenate(v_parts)[keep])
        return ext_ids, ext_start, ext_len

    def _write_decodes(self, dec_ids: np.ndarray, slots: np.ndarray) -> None:
        pos = self.kv_len[dec_ids]  # [num_decode] position of the token fed back
        tokens = generated_token_ids(self.key[dec_ids], pos - self.prompt_len[dec_ids])
        if self.beam_tokens:
            for i, seq_id in enumerate(dec_ids.tolist()):
                beam = self.beam_tokens.get(seq_id)
                if beam is not None:
                    tokens[i] = beam[pos[i] - self.prompt_len[seq_id]]
        with np.errstate(over="ignore"):
            acc = self.acc[dec_ids] + token_terms(tokens, pos)
        self.acc[dec_ids] = acc
        self.kv_len[dec_ids] = pos + 1
        k, v = self.content.rows(acc)
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

    def _launch(self, desc, q: np.ndarray, qo_indptr: np.ndarray | None):
        """The attention call for one batch (decode when `qo_indptr` is None, else extend), ready to
        run: host->device conversions happen here, outside the timed region. Counts the KV bytes read."""
        pool, xp, backend, kv_dtype = self.pool, self.pool.xp, self.backend, self.kv_dtype
        qd = xp.asarray(q)
        qo = None if qo_indptr is None else xp.asarray(qo_indptr)
        if isinstance(desc, PagedDescriptor):
            args = (pool.k, pool.v, xp.asarray(desc.kv_indptr), xp.asarray(desc.kv_indices),
                    xp.asarray(desc.kv_last_page_len), desc.block_size)
            kv_len = kernels.paged_kv_len(desc.kv_indptr, desc.kv_last_page_len, desc.block_size)
            if qo is None:
                call = lambda: kernels.paged_decode(qd, *args, backend=backend, kv_dtype=kv_dtype)
            else:
                call = lambda: kernels.paged_extend(qd, qo, *args, backend=backend, kv_dtype=kv_dtype)
        else:
            args = (pool.k, pool.v, xp.asarray(desc.kv_start), xp.asarray(desc.kv_len))
            kv_len = desc.kv_len
            if qo is None:
                call = lambda: kernels.contiguous_decode(qd, *args, backend=backend, kv_dtype=kv_dtype)
            else:
                call = lambda: kernels.contiguous_extend(qd, qo, *args, backend=backend, kv_dtype=kv_dtype)
        self.kernel_bytes += kernels.kv_bytes_read(kv_len, pool.k.shape[1], self.head_dim, kv_dtype)
        return call

    def _decode_launch(self, ids: list[int], dec_ids: np.ndarray, step: int):
        q = self._queries(dec_ids, self.kv_len[dec_ids] - 1, step)
        return q, self._launch(self.strategy.describe(ids), q, None)

    def _extend_launch(self, ext: tuple[list[int], list[int], list[int]], step: int):
        ids, starts, lens = ext
        q_seq = np.concatenate([np.full(n - s, i, dtype=np.int64) for i, s, n in zip(ids, starts, lens, strict=True)])
        q_pos = np.concatenate([np.arange(s, n, dtype=np.int64) for s, n in zip(starts, lens, strict=True)])
        qo_indptr = np.zeros(len(ids) + 1, dtype=np.int32)
        qo_indptr[1:] = np.cumsum([n - s for s, n in zip(starts, lens, strict=True)])
        q = self._queries(q_seq, q_pos, step)
        return q, qo_indptr, self._launch(self.strategy.describe(ids), q, qo_indptr)

    def _sync(self) -> None:
        if self.backend == "cupy":
            self.pool.xp.cuda.Device().synchronize()

    # ---- verification ------------------------------------------------------------------------
    def _reference_rows(self, seq_id: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        tokens = self.logical_tokens(seq_id, length)
        return self.content.rows(prefix_sums(token_terms(tokens, np.arange(length))))

    def _check(self, step: int, seq_id: int, out: np.ndarray, ref: np.ndarray, what: str) -> None:
        err = reference.rel_err(out, ref)
        if not err <= self.verify_max_rel_err:  # NaN-safe running max
            self.verify_max_rel_err = err
        if not err <= tolerance(self.kv_dtype):
            raise VerificationError(
                f"step {step}: request {int(self.request_of[seq_id])} (sequence {seq_id}) {what} attention "
                f"differs from the reference recomputed from its logical tokens: rel err {err:.3g} > "
                f"{tolerance(self.kv_dtype):g}")

    def _verify(self, step: int, dec_ids: np.ndarray, dec_out, ext, ext_out) -> None:
        rng = np.random.default_rng((self.seed, step))
        host = self._host
        if dec_out is not None:
            q, out = dec_out
            out = host(out)
            for i in rng.permutation(len(dec_ids))[:VERIFY_DECODE_SEQS]:
                seq_id, length = int(dec_ids[i]), int(self.kv_len[dec_ids[i]])
                k, v = self._reference_rows(seq_id, length)
                ref = reference.contiguous_decode(q[i:i + 1], k, v, np.zeros(1, np.int32),
                                                  np.array([length], np.int32), self.kv_dtype, self.scale)
                self._check(step, seq_id, out[i:i + 1], ref, "decode")
        if ext_out is not None:
            ids, starts, lens = ext
            q, qo_indptr, out = ext_out
            out = host(out)
            for j in rng.permutation(len(ids))[:VERIFY_EXTEND_SEQS]:
                seq_id, length = ids[j], lens[j]
                k, v = self._reference_rows(seq_id, length)
                lo, hi = int(qo_indptr[j]), int(qo_indptr[j + 1])
                ref = reference.contiguous_extend(q[lo:hi], np.array([0, hi - lo], np.int32), k, v,
                                                  np.zeros(1, np.int32), np.array([length], np.int32),
                                                  self.kv_dtype, self.scale)
                self._check(step, seq_id, out[lo:hi], ref, "extend")

    def _host(self, a) -> np.ndarray:
        return a.get() if self.backend == "cupy" else a
