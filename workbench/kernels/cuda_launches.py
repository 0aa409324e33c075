"""The CUDA kernel launches of every op, built once for both executors of the .cu kernels.

The CuPy backend hands each `Launch` to a `RawKernel`; the CPU shim backend hands the same launch to
the shim's cuLaunchKernel-like entry point, which checks every argument's size against the kernel's
parameter. So the shim tests exercise the GPU launcher's grids and argument lists, not a copy.
Functions take `xp` (numpy or cupy) for the buffers they allocate; inputs are already validated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.intmath import cdiv
from workbench.kernels import launch
from workbench.kernels.source import (
    ATTENTION_CU,
    CACHE_OPS_CU,
    CUDA_KV_TYPES,
    HEAD_DIMS,
    MERGE_KERNEL_NAME,
    MLA_CU,
    MLA_DIMS,
    attention_kernel_name,
    mla_kernel_name,
)

COPY_WORD_TYPES = {16: "uint4", 2: "unsigned short"}


@dataclass(frozen=True)
class Launch:
    """One kernel launch: source file, name expression, grid, block, and arguments in parameter order.

    Arguments are arrays (NumPy or CuPy, passed as device pointers) and NumPy scalars whose type is
    the kernel parameter's (np.int32 for int, np.int64 for long long, np.float32 for float).
    """

    source: str
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple


def attention(xp, q, qo_indptr, k_pool, v_pool, kv_dtype, scale, data_ptr, num_sms, *, paged=None,
              contiguous=None, partition_tokens=None, max_q_per_seq=None, blocks_per_sm=None, window=0):
    """Output buffer (float32 [total_q, H, D], NaN-poisoned) and the launches that fill it.

    paged = (kv_indptr, kv_indices, kv_last_page_len, block_size) or contiguous = (kv_start, kv_len).
    The plan needs every sequence's KV length and, unless `max_q_per_seq` is given, the most queries of one
    sequence: small reads of device arrays. `data_ptr(array)` is the array's address (alignment check);
    `blocks_per_sm(kernel_name)`, when given, is the kernel's real occupancy (split-K sizing).
    `window` > 0: each query reads only its last `window` positions (0 = full attention).
    """
    total_q, num_heads, head_dim = q.shape
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"the CUDA attention kernels are instantiated for head_dim in {HEAD_DIMS}, got {head_dim}")
    num_kv_heads = k_pool.shape[1]
    num_seqs = qo_indptr.shape[0] - 1
    out = xp.full(q.shape, np.nan, dtype=np.float32)  # an element the kernel misses stays NaN
    if total_q == 0:
        return out, []
    if paged is not None:
        kv_indptr, kv_indices, kv_last_page_len, block_size = paged
        kv_lens = (xp.diff(kv_indptr) - 1) * block_size + kv_last_page_len
        addressing, addressing_args = "paged", (kv_indptr, kv_indices, kv_last_page_len, np.int32(block_size))
    else:
        kv_start, kv_lens = contiguous
        addressing, addressing_args = "contiguous", (kv_start, kv_lens)
    if max_q_per_seq is None:
        max_q_per_seq = int(xp.diff(qo_indptr).max())
    rows = launch.plan_rows(num_heads, num_kv_heads, max_q_per_seq)
    kernel_name = attention_kernel_name(addressing, kv_dtype, head_dim, rows)
    occupancy = launch.DEFAULT_BLOCKS_PER_SM if blocks_per_sm is None else blocks_per_sm(kernel_name)
    # a block reads its rows' span: the whole prefix, or with a window at most window + max_q_per_seq - 1
    # positions; split-K is sized over every sequence's span (a small device-to-host copy on the GPU)
    span_tokens = np.asarray(kv_lens.get() if hasattr(kv_lens, "get") else kv_lens, dtype=np.int64)
    if window:
        span_tokens = np.minimum(span_tokens, window + max_q_per_seq - 1)
    plan = launch.plan_attention(num_heads, num_kv_heads, max_q_per_seq, span_tokens, num_sms, partition_tokens,
                                 blocks_per_sm=occupancy)
    launch.check_pool_alignment(head_dim, k_pool.itemsize, k_pool=data_ptr(k_pool), v_pool=data_ptr(v_pool))
    if plan.num_partitions > 1:
        part_out = xp.empty((total_q, num_heads, plan.num_partitions, head_dim), dtype=np.float32)
        part_ml = xp.empty((total_q, num_heads, plan.num_partitions, 2), dtype=np.float32)
    else:
        part_out = part_ml = out  # not touched by a single-partition launch
    launches = [Launch(
        ATTENTION_CU,
        kernel_name,
        plan.grid(num_kv_heads, num_seqs),
        (launch.ATTN_THREADS, 1, 1),
        (q, qo_indptr, k_pool, v_pool, *addressing_args, np.int32(num_heads), np.int32(num_kv_heads),
         np.int32(plan.row_chunks), np.int32(plan.partition_tokens), np.float32(scale), np.int32(window), out,
         part_out, part_ml),
    )]
    if plan.num_partitions > 1:
        launches.append(Launch(
            ATTENTION_CU, MERGE_KERNEL_NAME, (total_q, num_heads, 1), (launch.MERGE_THREADS, 1, 1),
            (part_out, part_ml, np.int32(plan.num_partitions), np.int32(head_dim), out),
        ))
    return out, launches


def cache_write(k_pool, v_pool, k_new, v_new, slot_mapping, data_ptr) -> list[Launch]:
    """write_cache: row i of k_new/v_new to slot slot_mapping[i] (int64; negative skips)."""
    if len(slot_mapping) == 0:
        return []
    row_bytes = k_pool.itemsize * k_pool.shape[1] * k_pool.shape[2]
    word = launch.copy_word_bytes(row_bytes, *(data_ptr(a) for a in (k_pool, v_pool, k_new, v_new)))
    row_words = row_bytes // word
    return [Launch(
        CACHE_OPS_CU, f"kvw::write_cache<{COPY_WORD_TYPES[word]}>",
        (len(slot_mapping), launch.copy_chunks(row_words), 1), (launch.COPY_THREADS, 1, 1),
        (k_new, v_new, slot_mapping, np.int32(row_words), k_pool, v_pool),
    )]


def cache_write_fp8(k_pool, v_pool, k_new, v_new, slot_mapping, source, kv_scales) -> list[Launch]:
    """write_cache_fp8: row i of k_new/v_new (model dtype `source`) to slot slot_mapping[i] of the fp8 pools as
    e4m3 codes of k_new / k_scale, v_new / v_scale (negative slots skip)."""
    if len(slot_mapping) == 0:
        return []
    row_elems = k_pool.shape[1] * k_pool.shape[2]
    return [Launch(
        CACHE_OPS_CU, f"kvw::write_cache_fp8<{CUDA_KV_TYPES[source]}>",
        (len(slot_mapping), launch.copy_chunks(row_elems), 1), (launch.COPY_THREADS, 1, 1),
        (k_new, v_new, slot_mapping, np.int32(row_elems), np.float32(kv_scales[0]), np.float32(kv_scales[1]),
         k_pool, v_pool),
    )]


def copy_blocks(src_k, src_v, dst_k, dst_v, pairs, block_size, data_ptr) -> list[Launch]:
    """copy_blocks: block pairs[i][1] of the dst pools gets block pairs[i][0] of the src pools (pairs int32 [n, 2])."""
    if len(pairs) == 0:
        return []
    block_bytes = block_size * src_k.itemsize * src_k.shape[1] * src_k.shape[2]
    word = launch.copy_word_bytes(block_bytes, *(data_ptr(a) for a in (src_k, src_v, dst_k, dst_v)))
    block_words = block_bytes // word
    return [Launch(
        CACHE_OPS_CU, f"kvw::copy_blocks<{COPY_WORD_TYPES[word]}>",
        (len(pairs), launch.copy_chunks(block_words), 1), (launch.COPY_THREADS, 1, 1),
        (src_k, src_v, dst_k, dst_v, pairs, np.int64(block_words)),
    )]


def attention_entry_points(prepare_attention, xp):
    """The four docs/kernels.md attention entry points of a CUDA executor, each prepared: `prepare_paged_decode(...)`
    takes the entry point's arguments, plans the launches and allocates the output, and returns a call that
    only launches them and returns the output (the engine times that call alone). `prepare_attention(q,
    qo_indptr, k_pool, v_pool, kv_dtype, scale, *, paged=None, contiguous=None, max_q_per_seq=None, window=0)`
    is the executor's own, returning such a call.

    Decode is extend with one query per sequence; passing `max_q_per_seq=1` saves reading the
    query offsets back to find their widest gap (a device-to-host copy on the GPU). kv_scales =
    (k_scale, v_scale), the fp8 per-tensor scales: k_scale folds into the softmax scale and v_scale
    multiplies the output (attention is linear in V); both are 1.0 for the other dtypes.
    """

    def scaled(call, kv_scales):
        if kv_scales[1] == 1.0:
            return call

        def scaled_call():
            out = call()
            out *= np.float32(kv_scales[1])
            return out
        return scaled_call

    def decode_indptr(num_seqs: int):
        return xp.arange(num_seqs + 1, dtype=xp.int32)  # one query token per sequence

    def paged_decode(q, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, block_size, kv_dtype, scale,
                     kv_scales=(1.0, 1.0), window=0):
        """Decode attention over a CSR page table → float32 [num_seqs, num_heads, head_dim]."""
        paged = (kv_indptr, kv_indices, kv_last_page_len, block_size)
        return scaled(prepare_attention(q, decode_indptr(q.shape[0]), k_pool, v_pool, kv_dtype, scale * kv_scales[0],
                                        paged=paged, max_q_per_seq=1, window=window), kv_scales)

    def contiguous_decode(q, k_pool, v_pool, kv_start, kv_len, kv_dtype, scale, kv_scales=(1.0, 1.0), window=0):
        """Decode attention over contiguous extents → float32 [num_seqs, num_heads, head_dim]."""
        return scaled(prepare_attention(q, decode_indptr(q.shape[0]), k_pool, v_pool, kv_dtype, scale * kv_scales[0],
                                        contiguous=(kv_start, kv_len), max_q_per_seq=1, window=window), kv_scales)

    def paged_extend(q, qo_indptr, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, block_size, kv_dtype,
                     scale, kv_scales=(1.0, 1.0), window=0):
        """Causal extend attention over a CSR page table → float32 [total_q, num_heads, head_dim]."""
        paged = (kv_indptr, kv_indices, kv_last_page_len, block_size)
        return scaled(prepare_attention(q, qo_indptr, k_pool, v_pool, kv_dtype, scale * kv_scales[0], paged=paged,
                                        window=window), kv_scales)

    def contiguous_extend(q, qo_indptr, k_pool, v_pool, kv_start, kv_len, kv_dtype, scale, kv_scales=(1.0, 1.0),
                          window=0):
        """Causal extend attention over contiguous extents → float32 [total_q, num_heads, head_dim]."""
        return scaled(prepare_attention(q, qo_indptr, k_pool, v_pool, kv_dtype, scale * kv_scales[0],
                                        contiguous=(kv_start, kv_len), window=window), kv_scales)

    return paged_decode, contiguous_decode, paged_extend, contiguous_extend


def launch_call(run, launches: list[Launch], out):
    """A call that hands `launches` to the executor's `run` and returns `out`, which they fill."""

    def call():
        run(launches)
        return out

    return call


def launched_now(prepare):
    """The entry point that prepares and launches at once: `prepare(...)()`."""

    def call(*args, **kwargs):
        return prepare(*args, **kwargs)()

    call.__name__ = call.__qualname__ = prepare.__name__
    call.__doc__ = prepare.__doc__
    return call


def mla_decode(xp, q_latent, q_rope, pool, kv_dtype, scale, kv_scale, *, paged=None, contiguous=None,
               selected=None):
    """Output buffer (float32 [num_seqs, H, kv_lora_rank], NaN-poisoned) and the latent attention launch.

    paged = (kv_indptr, kv_indices, kv_last_page_len, block_size) or contiguous = (kv_start, kv_len);
    selected = (sel_indptr, sel_positions) for the sparse variant (None: every position)."""
    num_seqs, num_heads, latent = q_latent.shape
    rope = q_rope.shape[2]
    if (latent, rope) not in MLA_DIMS:
        raise ValueError(f"the CUDA latent attention kernel is instantiated for (kv_lora_rank, qk_rope_head_dim) in "
                         f"{MLA_DIMS}, got {(latent, rope)}")
    out = xp.full(q_latent.shape, np.nan, dtype=np.float32)
    if num_seqs == 0:
        return out, []
    if paged is not None:
        kv_indptr, kv_indices, kv_last_page_len, block_size = paged
        addressing, addressing_args = "paged", (kv_indptr, kv_indices, kv_last_page_len, np.int32(block_size))
    else:
        addressing, addressing_args = "contiguous", tuple(contiguous)
    sparse = selected is not None
    # the dense kernel never reads the selection: any int32 array stands in for it
    sel_indptr, sel_positions = selected if sparse else (addressing_args[0], addressing_args[0])
    kernel = mla_kernel_name(addressing, kv_dtype, latent, rope, sparse)
    grid = (cdiv(num_heads, launch.MLA_HEADS), num_seqs, 1)
    return out, [Launch(MLA_CU, kernel, grid, (launch.MLA_THREADS, 1, 1),
                        (q_latent, q_rope, pool, *addressing_args, sel_indptr, sel_positions, np.int32(num_heads),
                         np.float32(scale), np.float32(kv_scale), out))]
