"""Backend `cupy`: the CUDA C kernels of `kernels/` compiled by NVRTC through CuPy `RawModule` and run on the GPU.

One RawModule per template instantiation (KV dtype, head dim, rows per block, addressing), compiled
on first use and cached here (and on disk by CuPy). The launches (grids, argument lists) come from
`workbench.kernels.cuda_launches`, the same ones the CPU shim backend runs in the tests. Same
positional signatures as the other backends (docs/kernels.md), inputs already validated by
`workbench.kernels`; CuPy arrays in and out, except that `block_swap` accepts NumPy (host) pools
on one side.
"""

from __future__ import annotations

from functools import cache

import cupy as cp
import numpy as np

from workbench.kernels import cuda_launches, launch
from workbench.kernels.nvrtc import source_options
from workbench.kernels.source import ATTENTION_CU, read_source, sources_digest


@cache
def _kernel(source_name: str, name_expression: str) -> cp.RawKernel:
    """The kernel `name_expression` of `source_name`, compiled once per process (CuPy also caches on disk).

    CuPy's disk cache keys on the code text, not on the headers it includes, so the code starts with
    a digest of every kernel source file.
    """
    code = f"// kernel sources {sources_digest()}\n" + read_source(source_name)
    module = cp.RawModule(code=code, options=tuple(source_options()), name_expressions=(name_expression,))
    return module.get_function(name_expression)


def compile_kernel(source_name: str, name_expression: str) -> None:
    """Compile one kernel now (or load it from CuPy's disk cache), as its first launch would: the GPU
    check's warm-up step (benchmarks/gpu_warmup.py) fills the disk cache before the timed tests."""
    _kernel(source_name, name_expression)


@cache
def num_sms(device_id: int) -> int:
    return int(cp.cuda.Device(device_id).attributes["MultiProcessorCount"])


@cache
def blocks_per_sm(kernel_name: str) -> int:
    """Resident blocks per SM of attention kernel `kernel_name` on the current device: its registers and
    static shared memory (from the compiled kernel) against the SM's limits."""
    attributes = _kernel(ATTENTION_CU, kernel_name).attributes
    device = cp.cuda.Device().attributes
    return launch.occupancy_blocks_per_sm(
        int(attributes["num_regs"]), int(attributes["shared_size_bytes"]),
        int(device.get("MaxSharedMemoryPerMultiprocessor", 228 * 1024)),
        sm_registers=int(device.get("MaxRegistersPerMultiprocessor", launch.SM_REGISTERS)),
        sm_threads=int(device.get("MaxThreadsPerMultiProcessor", launch.SM_THREADS)),
        sm_max_blocks=int(device.get("MaxBlocksPerMultiprocessor", launch.SM_MAX_BLOCKS)))


def run(launches: list[cuda_launches.Launch]) -> None:
    """Launch each kernel on the current stream."""
    for item in launches:
        _kernel(item.source, item.kernel)(item.grid, item.block, item.args)


def _data_ptr(array) -> int:
    return array.data.ptr


def mla_decode(q_latent, q_rope, pool, kv_dtype, scale, kv_scale, *, paged=None, contiguous=None, selected=None):
    """Latent attention (`workbench.kernels.mla`, validated there) on the current stream: float32 CuPy array."""
    out, launches = cuda_launches.mla_decode(cp, q_latent, q_rope, pool, kv_dtype, scale, kv_scale, paged=paged,
                                             contiguous=contiguous, selected=selected)
    run(launches)
    return out


def prepare_attention(q, qo_indptr, k_pool, v_pool, kv_dtype, scale, *, paged=None, contiguous=None,
                      partition_tokens=None, max_q_per_seq=None, window=0):
    """Extend attention (decode when every sequence has one query) on the GPU, planned: returns a call that
    launches the kernels on the current stream and returns float32 [total_q, H, D].

    paged = (kv_indptr, kv_indices, kv_last_page_len, block_size) or contiguous = (kv_start, kv_len).
    """
    out, launches = cuda_launches.attention(
        cp, q, qo_indptr, k_pool, v_pool, kv_dtype, scale, _data_ptr, num_sms(q.device.id), paged=paged,
        contiguous=contiguous, partition_tokens=partition_tokens, max_q_per_seq=max_q_per_seq,
        blocks_per_sm=blocks_per_sm, window=window,
    )
    for item in launches:  # compile now (first use), not inside the launch call
        _kernel(item.source, item.kernel)
    return cuda_launches.launch_call(run, launches, out)


attention = cuda_launches.launched_now(prepare_attention)
prepare_paged_decode, prepare_contiguous_decode, prepare_paged_extend, prepare_contiguous_extend = \
    cuda_launches.attention_entry_points(prepare_attention, cp)
paged_decode, contiguous_decode, paged_extend, contiguous_extend = map(
    cuda_launches.launched_now,
    (prepare_paged_decode, prepare_contiguous_decode, prepare_paged_extend, prepare_contiguous_extend))


def cache_write(k_pool, v_pool, k_new, v_new, slot_mapping) -> None:
    """Mutates the pools: row i of k_new/v_new goes to slot slot_mapping[i]; negative slots are skipped."""
    run(cuda_launches.cache_write(k_pool, v_pool, k_new, v_new, slot_mapping, _data_ptr))


def cache_write_fp8(k_pool, v_pool, k_new, v_new, slot_mapping, source, kv_scales) -> None:
    """Mutates the fp8 pools: row i of k_new/v_new (model dtype `source`) goes to slot slot_mapping[i] as the
    e4m3 codes of k_new / k_scale and v_new / v_scale; negative slots are skipped."""
    run(cuda_launches.cache_write_fp8(k_pool, v_pool, k_new, v_new, slot_mapping, source, kv_scales))


def block_copy(k_pool, v_pool, copies, block_size) -> None:
    """Mutates the pools: block dst gets a copy of block src for every (src, dst) row of `copies`."""
    run(cuda_launches.copy_blocks(k_pool, v_pool, k_pool, v_pool, cp.asarray(copies), block_size, _data_ptr))


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
        run(cuda_launches.copy_blocks(src_k, src_v, dst_k, dst_v, cp.asarray(moves), block_size, _data_ptr))
        return
    moves_host = cp.asnumpy(moves).astype(np.int64)  # [num_moves, 2]
    staged = np.arange(len(moves_host), dtype=np.int32)  # staging block i holds move i
    if src_host:
        staging = [cp.asarray(_gather_host(pool, moves_host[:, 0], block_size)) for pool in (src_k, src_v)]
        pairs = cp.asarray(np.stack([staged, moves_host[:, 1].astype(np.int32)], axis=1))
        run(cuda_launches.copy_blocks(*staging, dst_k, dst_v, pairs, block_size, _data_ptr))
    else:
        staging = [cp.empty((len(moves_host) * block_size, *src_k.shape[1:]), dtype=src_k.dtype) for _ in range(2)]
        pairs = cp.asarray(np.stack([moves_host[:, 0].astype(np.int32), staged], axis=1))
        run(cuda_launches.copy_blocks(src_k, src_v, *staging, pairs, block_size, _data_ptr))
        for pool, stage in zip((dst_k, dst_v), staging, strict=True):
            _scatter_host(pool, cp.asnumpy(stage), moves_host[:, 1], block_size)


def _gather_host(pool: np.ndarray, blocks: np.ndarray, block_size: int) -> np.ndarray:
    """Blocks `blocks` of a host pool, back to back: [len(blocks) * block_size, ...]."""
    slots = (blocks[:, None] * block_size + np.arange(block_size)).reshape(-1)
    return np.ascontiguousarray(pool[slots])


def _scatter_host(pool: np.ndarray, staged: np.ndarray, blocks: np.ndarray, block_size: int) -> None:
    """Mutates `pool`: block blocks[i] gets staged block i."""
    slots = (blocks[:, None] * block_size + np.arange(block_size)).reshape(-1)
    pool[slots] = staged
