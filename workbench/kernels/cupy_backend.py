"""Backend `cupy`: the CUDA C kernels of `kernels/` compiled by NVRTC through CuPy `RawModule` and run on the GPU.

One RawModule per template instantiation (KV dtype, head dim, rows per block, addressing), compiled
on first use and cached here (and on disk by CuPy). Launch grids come from `workbench.kernels.launch`,
the same plans the CPU shim backend runs. Same positional signatures as the other backends (DESIGN §7),
inputs already validated by `workbench.kernels`; CuPy arrays in and out, except that `block_swap`
accepts NumPy (host) pools on one side.
"""

from __future__ import annotations

from functools import cache

import cupy as cp
import numpy as np

from workbench.kernels import launch
from workbench.kernels.nvrtc import source_options
from workbench.kernels.source import (
    ATTENTION_CU,
    CACHE_OPS_CU,
    HEAD_DIMS,
    MERGE_KERNEL_NAME,
    attention_kernel_name,
    read_source,
    sources_digest,
)

COPY_WORD_TYPES = {16: "uint4", 2: "unsigned short"}


@cache
def _kernel(source_name: str, name_expression: str) -> cp.RawKernel:
    """The kernel `name_expression` of `source_name`, compiled once per process (CuPy also caches on disk).

    CuPy's disk cache keys on the code text, not on the headers it includes, so the code starts with
    a digest of every kernel source file.
    """
    code = f"// kernel sources {sources_digest()}\n" + read_source(source_name)
    module = cp.RawModule(code=code, options=tuple(source_options()), name_expressions=(name_expression,))
    return module.get_function(name_expression)


@cache
def num_sms(device_id: int) -> int:
    return int(cp.cuda.Device(device_id).attributes["MultiProcessorCount"])


def attention(q, qo_indptr, k_pool, v_pool, kv_dtype, scale, *, paged=None, contiguous=None, partition_tokens=None,
              max_q_per_seq=None):
    """Extend attention (decode when every sequence has one query) on the GPU → float32 [total_q, H, D].

    paged = (kv_indptr, kv_indices, kv_last_page_len, block_size) or contiguous = (kv_start, kv_len).
    The launch plan needs the longest KV length (and, unless `max_q_per_seq` is given, the most
    queries of one sequence): one small device-to-host read per call.
    """
    total_q, num_heads, head_dim = q.shape
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"the CUDA attention kernels are instantiated for head_dim in {HEAD_DIMS}, got {head_dim}")
    num_kv_heads = k_pool.shape[1]
    num_seqs = qo_indptr.shape[0] - 1
    out = cp.full(q.shape, cp.nan, dtype=cp.float32)  # poisoned: an element the kernel misses stays NaN
    if total_q == 0:
        return out
    if paged is not None:
        kv_indptr, kv_indices, kv_last_page_len, block_size = paged
        kv_lens = (cp.diff(kv_indptr) - 1) * block_size + kv_last_page_len
        addressing, addressing_args = "paged", (kv_indptr, kv_indices, kv_last_page_len, np.int32(block_size))
    else:
        kv_start, kv_lens = contiguous
        addressing, addressing_args = "contiguous", (kv_start, kv_lens)
    if max_q_per_seq is None:
        max_kv_len, max_q_per_seq = (int(x) for x in cp.stack([kv_lens.max(), cp.diff(qo_indptr).max()]).get())
    else:
        max_kv_len = int(kv_lens.max())
    plan = launch.plan_attention(num_seqs, num_heads, num_kv_heads, max_q_per_seq, max_kv_len,
                                 num_sms(q.device.id), partition_tokens)
    launch.check_pool_alignment(head_dim, k_pool.itemsize, k_pool=k_pool.data.ptr, v_pool=v_pool.data.ptr)
    if plan.num_partitions > 1:
        part_out = cp.empty((total_q, num_heads, plan.num_partitions, head_dim), dtype=cp.float32)
        part_ml = cp.empty((total_q, num_heads, plan.num_partitions, 2), dtype=cp.float32)
    else:
        part_out = part_ml = out  # not touched by a single-partition launch
    kernel = _kernel(ATTENTION_CU, attention_kernel_name(addressing, kv_dtype, head_dim, plan.rows))
    kernel(
        plan.grid(num_kv_heads, num_seqs),
        (launch.ATTN_THREADS,),
        (q, qo_indptr, k_pool, v_pool, *addressing_args, np.int32(num_heads), np.int32(num_kv_heads),
         np.int32(plan.row_chunks), np.int32(plan.partition_tokens), np.float32(scale), out, part_out, part_ml),
    )
    if plan.num_partitions > 1:
        merge = _kernel(ATTENTION_CU, MERGE_KERNEL_NAME)
        merge((total_q, num_heads), (launch.MERGE_THREADS,),
              (part_out, part_ml, np.int32(plan.num_partitions), np.int32(head_dim), out))
    return out


def _decode_indptr(num_seqs: int):
    return cp.arange(num_seqs + 1, dtype=cp.int32)  # one query token per sequence


def paged_decode(q, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, block_size, kv_dtype, scale):
    """Decode attention over a CSR page table → float32 [num_seqs, num_heads, head_dim]."""
    paged = (kv_indptr, kv_indices, kv_last_page_len, block_size)
    return attention(q, _decode_indptr(q.shape[0]), k_pool, v_pool, kv_dtype, scale, paged=paged, max_q_per_seq=1)


def contiguous_decode(q, k_pool, v_pool, kv_start, kv_len, kv_dtype, scale):
    """Decode attention over contiguous extents → float32 [num_seqs, num_heads, head_dim]."""
    contiguous = (kv_start, kv_len)
    return attention(q, _decode_indptr(q.shape[0]), k_pool, v_pool, kv_dtype, scale, contiguous=contiguous,
                     max_q_per_seq=1)


def paged_extend(q, qo_indptr, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, block_size, kv_dtype, scale):
    """Causal extend attention over a CSR page table → float32 [total_q, num_heads, head_dim]."""
    paged = (kv_indptr, kv_indices, kv_last_page_len, block_size)
    return attention(q, qo_indptr, k_pool, v_pool, kv_dtype, scale, paged=paged)


def contiguous_extend(q, qo_indptr, k_pool, v_pool, kv_start, kv_len, kv_dtype, scale):
    """Causal extend attention over contiguous extents → float32 [total_q, num_heads, head_dim]."""
    return attention(q, qo_indptr, k_pool, v_pool, kv_dtype, scale, contiguous=(kv_start, kv_len))


def cache_write(k_pool, v_pool, k_new, v_new, slot_mapping) -> None:
    """Mutates the pools: row i of k_new/v_new goes to slot slot_mapping[i]; negative slots are skipped."""
    if len(slot_mapping) == 0:
        return
    row_bytes = k_pool[0].nbytes
    word = launch.copy_word_bytes(row_bytes, *(a.data.ptr for a in (k_pool, v_pool, k_new, v_new)))
    row_words = row_bytes // word
    kernel = _kernel(CACHE_OPS_CU, f"kvw::write_cache<{COPY_WORD_TYPES[word]}>")
    kernel((len(slot_mapping), launch.copy_chunks(row_words)), (launch.COPY_THREADS,),
           (k_new, v_new, slot_mapping, np.int32(row_words), k_pool, v_pool))


def block_copy(k_pool, v_pool, copies, block_size) -> None:
    """Mutates the pools: block dst gets a copy of block src for every (src, dst) row of `copies`."""
    _copy_blocks(k_pool, v_pool, k_pool, v_pool, copies, block_size)


def block_swap(src_k, src_v, dst_k, dst_v, moves, block_size) -> None:
    """Mutates dst_k/dst_v: block dst of the dst pools gets block src of the src pools per (src, dst) row.

    Either side may be NumPy (host) pools: the moved blocks then travel through one contiguous
    staging buffer, gathered on the sending side and scattered on the receiving side, so the
    transfer is a single host-device copy.
    """
    src_host, dst_host = isinstance(src_k, np.ndarray), isinstance(dst_k, np.ndarray)
    if src_host and dst_host:
        raise ValueError("block_swap on cupy: at least one side must be device (CuPy) pools")
    if not (src_host or dst_host):
        _copy_blocks(src_k, src_v, dst_k, dst_v, cp.asarray(moves), block_size)
        return
    moves_host = cp.asnumpy(moves).astype(np.int64)  # [num_moves, 2]
    staged = np.arange(len(moves_host), dtype=np.int32)  # staging block i holds move i
    if src_host:
        staging = [cp.asarray(_gather_host(pool, moves_host[:, 0], block_size)) for pool in (src_k, src_v)]
        pairs = cp.asarray(np.stack([staged, moves_host[:, 1].astype(np.int32)], axis=1))
        _copy_blocks(*staging, dst_k, dst_v, pairs, block_size)
    else:
        staging = [cp.empty((len(moves_host) * block_size, *src_k.shape[1:]), dtype=src_k.dtype) for _ in range(2)]
        pairs = cp.asarray(np.stack([moves_host[:, 0].astype(np.int32), staged], axis=1))
        _copy_blocks(src_k, src_v, *staging, pairs, block_size)
        for pool, stage in zip((dst_k, dst_v), staging, strict=True):
            _scatter_host(pool, cp.asnumpy(stage), moves_host[:, 1], block_size)


def _copy_blocks(src_k, src_v, dst_k, dst_v, pairs, block_size) -> None:
    """copy_blocks kernel over device pools; `pairs` int32 [n, 2] on the device."""
    if len(pairs) == 0:
        return
    block_bytes = block_size * src_k[0].nbytes
    word = launch.copy_word_bytes(block_bytes, *(a.data.ptr for a in (src_k, src_v, dst_k, dst_v)))
    block_words = block_bytes // word
    kernel = _kernel(CACHE_OPS_CU, f"kvw::copy_blocks<{COPY_WORD_TYPES[word]}>")
    kernel((len(pairs), launch.copy_chunks(block_words)), (launch.COPY_THREADS,),
           (src_k, src_v, dst_k, dst_v, pairs, np.int64(block_words)))


def _gather_host(pool: np.ndarray, blocks: np.ndarray, block_size: int) -> np.ndarray:
    """Blocks `blocks` of a host pool, back to back: [len(blocks) * block_size, ...]."""
    slots = (blocks[:, None] * block_size + np.arange(block_size)).reshape(-1)
    return np.ascontiguousarray(pool[slots])


def _scatter_host(pool: np.ndarray, staged: np.ndarray, blocks: np.ndarray, block_size: int) -> None:
    """Mutates `pool`: block blocks[i] gets staged block i."""
    slots = (blocks[:, None] * block_size + np.arange(block_size)).reshape(-1)
    pool[slots] = staged
