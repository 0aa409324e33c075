"""The kernel runner's side of a latent KV layout (multi-head latent attention; docs/kernels.md).

The pool of a latent model is one "head" of kv_lora_rank + qk_rope_head_dim values per slot: the latent and
the rotary key, shared by every query head. The pool classes move K and V together (writes, copies, swaps,
tiers), so V carries the same rows as K: every block move keeps both exact, and the kernel reads K.

Queries are in absorbed form (per head a latent and a rotary part: the q_table rows split in two). With DeepSeek
Sparse Attention a decode query attends its top-k positions; there are no real indexer weights, so the
positions are the k highest of seeded scores, a hash of (seed, sequence, step, position): deterministic,
different for every query, and the same in the kernel's call and in its verification.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.kernels import mla
from workbench.splitmix import mix64

_SEQ_MUL, _STEP_MUL, _POS_MUL = (np.uint64(0xD1B54A32D192ED03), np.uint64(0x8CB92BA72F3D8DD7),
                                 np.uint64(0xAEF17502108EF2D9))


@dataclass(frozen=True)
class LatentKernel:
    """What the runner needs of a latent model: the row's two parts, the top-k of sparse attention (0: dense)
    and the softmax scale (1/sqrt of a head's query-key width: head_dim + qk_rope_head_dim)."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    index_topk: int
    scale: float

    @property
    def row_width(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim


def latent_kernel(model) -> LatentKernel | None:
    """The LatentKernel of a workbench.presets.ModelPreset (None for per-head K/V)."""
    if model.kv_layout != "latent":
        return None
    return LatentKernel(model.kv_lora_rank, model.qk_rope_head_dim, model.index_topk,
                        1.0 / float(np.sqrt(model.head_dim + model.qk_rope_head_dim)))


def top_k_positions(seq_ids: np.ndarray, kv_lens: np.ndarray, topk: int, step: int, seed: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """CSR (sel_indptr int32 [n + 1], sel_positions int32 [nnz]): for each decode query, every position when
    its kv_len <= topk, else the topk positions of highest seeded score, ascending."""
    chosen = []
    for seq_id, kv_len in zip(seq_ids.tolist(), kv_lens.tolist(), strict=True):
        if kv_len <= topk:
            chosen.append(np.arange(kv_len, dtype=np.int32))
            continue
        with np.errstate(over="ignore"):
            base = np.uint64(seed) ^ np.uint64(seq_id) * _SEQ_MUL ^ np.uint64(step) * _STEP_MUL
            scores = mix64(base + np.arange(kv_len, dtype=np.uint64) * _POS_MUL)  # [kv_len]
        chosen.append(np.sort(np.argpartition(scores, kv_len - topk)[kv_len - topk:]).astype(np.int32))
    indptr = np.zeros(len(chosen) + 1, dtype=np.int32)
    indptr[1:] = np.cumsum([len(c) for c in chosen])
    return indptr, np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int32)


def prepare_decode(latent: LatentKernel, desc, pool, q: np.ndarray, selected, backend: str, kv_dtype: str):
    """The latent decode call over `desc` (a paged or contiguous descriptor of the decode batch), checked and
    ready to run; `q` float32 [n, heads, row_width] splits into the latent and rotary queries."""
    from workbench.allocators.values import PagedDescriptor

    xp = pool.xp
    rows = pool.k.reshape(pool.k.shape[0], latent.row_width)  # [num_slots, row_width]
    q_latent = xp.asarray(np.ascontiguousarray(q[:, :, :latent.kv_lora_rank]))
    q_rope = xp.asarray(np.ascontiguousarray(q[:, :, latent.kv_lora_rank:]))
    sel = None if selected is None else tuple(xp.asarray(a) for a in selected)
    kw = dict(backend=backend, kv_dtype=kv_dtype, scale=latent.scale, selected=sel)
    if isinstance(desc, PagedDescriptor):
        table = (xp.asarray(desc.kv_indptr), xp.asarray(desc.kv_indices), xp.asarray(desc.kv_last_page_len))
        return mla.prepare_paged_mla_decode(q_latent, q_rope, rows, *table, desc.block_size, **kw)
    return mla.prepare_contiguous_mla_decode(q_latent, q_rope, rows, xp.asarray(desc.kv_start),
                                             xp.asarray(desc.kv_len), **kw)


def reference_decode(latent: LatentKernel, q: np.ndarray, rows: np.ndarray, positions, kv_dtype: str) -> np.ndarray:
    """float64 [1, heads, kv_lora_rank]: one query `q` [1, heads, row_width] over the sequence's logical rows
    [length, 1, row_width] (storage dtype), restricted to `positions` (int32, or None for all)."""
    length = rows.shape[0]
    flat = rows.reshape(length, latent.row_width)
    selected = None if positions is None else (np.array([0, len(positions)], np.int32), positions)
    return mla.reference(q[:, :, :latent.kv_lora_rank], q[:, :, latent.kv_lora_rank:], flat, kv_dtype, latent.scale,
                         1.0, contiguous=(np.zeros(1, np.int32), np.array([length], np.int32)), selected=selected)
