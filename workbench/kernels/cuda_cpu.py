"""Backend `cuda-cpu`: the CUDA C kernels of `kernels/` executed on the CPU through the fiber shim.

The shim library (`kernels/cuda_cpu_entry.cpp` + `cuda_cpu_shim.h` + the unmodified .cu files) is
built with g++ on first use into a cache folder keyed by a hash of every source, the compiler and
the flags, then loaded with ctypes. Slow (every CUDA thread is a fiber): for correctness tests at
small shapes. It runs the same launch plans as the CuPy backend (`workbench.kernels.launch`) on
an H200. Linux x86-64 with g++ and a CUDA 13 toolkit's headers.
Same positional signatures as the other backends (DESIGN §7); NumPy in, NumPy out.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import numpy as np

from workbench.kernels import launch
from workbench.kernels.source import HEAD_DIMS, SHIM_ENTRY, cuda_include_dirs, kernels_dir, sources_digest
from workbench.paths import REPO_ROOT

CXX = os.environ.get("CXX", "g++")
CXX_FLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-pthread")
KV_DTYPE_CODES = {"fp32": 0, "fp16": 1, "bf16": 2}
# The shim plans launches for this many SMs (an H200's), whatever CPU it runs on: results do not
# depend on the machine's core count, and the shim runs the grids the GPU would run.
PLAN_SMS = 132


class ShimBuildError(RuntimeError):
    """The host compiler rejected the shim build; the message carries its output."""


def shim_include_dir() -> Path:
    """A CUDA include folder a host compiler can use: cuda_fp16.h plus crt/host_defines.h and nv/target.

    A CUDA 13 toolkit has all three; so do the nvidia-cuda-runtime, nvidia-cuda-crt and
    nvidia-cuda-cccl 13.0 wheels installed together.
    """
    for folder in cuda_include_dirs():
        if (folder / "crt" / "host_defines.h").is_file() and (folder / "nv" / "target").is_file():
            return folder
    raise ShimBuildError(
        "the cuda-cpu backend needs CUDA 13 headers a host compiler can use (cuda_fp16.h, crt/host_defines.h, "
        "nv/target): install nvidia-cuda-runtime, nvidia-cuda-crt and nvidia-cuda-cccl 13.0.*, or a toolkit "
        "at $CUDA_HOME or /usr/local/cuda"
    )


def cache_dir() -> Path:
    """$WORKBENCH_CACHE_DIR, else `.cache/` of a source checkout, else ~/.cache/kv-workbench."""
    if os.environ.get("WORKBENCH_CACHE_DIR"):
        return Path(os.environ["WORKBENCH_CACHE_DIR"]) / "cuda_cpu"
    if kernels_dir() == REPO_ROOT / "kernels":
        return REPO_ROOT / ".cache" / "cuda_cpu"
    return Path.home() / ".cache" / "kv-workbench" / "cuda_cpu"


def build_library(entry: Path, depends: tuple[Path, ...] = ()) -> Path:
    """Compile `entry` (C++ that includes the shim and .cu files) to a shared library, cached by content.

    The key covers `entry`, `depends` (other files it includes), every kernel source file, the
    compiler's version and the flags, so an edit anywhere rebuilds. The library is written under a
    temporary name and renamed into place, so concurrent test processes never load a half-written
    file. Raises ShimBuildError with the compiler's output on failure.
    """
    include = shim_include_dir()
    version = subprocess.run([CXX, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256()
    for part in (version, " ".join(CXX_FLAGS), str(include), str(kernels_dir())):
        key.update(part.encode() + b"\0")
    key.update(sources_digest().encode())
    for path in [entry, *depends]:
        key.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    target = cache_dir() / key.hexdigest()[:20] / f"lib{entry.stem}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    includes = [f"-I{kernels_dir()}", f"-I{entry.parent}", f"-I{include}"]
    command = [CXX, *CXX_FLAGS, *includes, "-x", "c++", str(entry), "-o", tmp]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(tmp)
        raise ShimBuildError(f"building the CUDA CPU shim failed:\n$ {' '.join(command)}\n{result.stderr}")
    os.replace(tmp, target)
    return target


class AttentionArgs(ctypes.Structure):
    """Mirrors `AttentionArgs` of kernels/cuda_cpu_entry.cpp field for field."""

    _fields_ = [
        ("paged", ctypes.c_int),
        ("kv_dtype", ctypes.c_int),
        ("head_dim", ctypes.c_int),
        ("rows", ctypes.c_int),
        ("q", ctypes.c_void_p),
        ("qo_indptr", ctypes.c_void_p),
        ("k_pool", ctypes.c_void_p),
        ("v_pool", ctypes.c_void_p),
        ("kv_indptr", ctypes.c_void_p),
        ("kv_indices", ctypes.c_void_p),
        ("kv_last_page_len", ctypes.c_void_p),
        ("kv_start", ctypes.c_void_p),
        ("kv_len", ctypes.c_void_p),
        ("block_size", ctypes.c_int),
        ("num_heads", ctypes.c_int),
        ("num_kv_heads", ctypes.c_int),
        ("num_seqs", ctypes.c_int),
        ("row_chunks", ctypes.c_int),
        ("num_partitions", ctypes.c_int),
        ("partition_tokens", ctypes.c_int),
        ("scale", ctypes.c_float),
        ("out", ctypes.c_void_p),
        ("part_out", ctypes.c_void_p),
        ("part_ml", ctypes.c_void_p),
        ("os_threads", ctypes.c_int),
    ]


@cache
def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build_library(kernels_dir() / SHIM_ENTRY)))
    p, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    lib.kvw_attention.argtypes = [ctypes.POINTER(AttentionArgs)]
    lib.kvw_attention.restype = i
    lib.kvw_merge_partitions.argtypes = [p, p, i, i, i, i, p, i, i]
    lib.kvw_merge_partitions.restype = None
    lib.kvw_write_cache.argtypes = [i, p, p, p, i, i, p, p, i, i, i]
    lib.kvw_write_cache.restype = i
    lib.kvw_copy_blocks.argtypes = [i, p, p, p, p, p, i, ll, i, i, i]
    lib.kvw_copy_blocks.restype = i
    return lib


def os_threads() -> int:
    """OS threads a launch spreads its blocks over: the CPUs this process may use."""
    return len(os.sched_getaffinity(0))


def _ptr(array: np.ndarray, dtype=None) -> int:
    """Data address of a C-contiguous array (of `dtype` when given): what a raw kernel argument needs."""
    if dtype is not None and array.dtype != np.dtype(dtype):
        raise ValueError(f"expected a {np.dtype(dtype)} array, got {array.dtype}")
    if not array.flags.c_contiguous:
        raise ValueError("kernel arrays must be C-contiguous")
    return array.ctypes.data


def attention(q, qo_indptr, k_pool, v_pool, kv_dtype, scale, *, paged=None, contiguous=None, partition_tokens=None):
    """Extend attention (decode when every sequence has one query) through the shim → float32 [total_q, H, D].

    paged = (kv_indptr, kv_indices, kv_last_page_len, block_size) or contiguous = (kv_start, kv_len).
    `partition_tokens` forces a split-K partition size instead of the launcher heuristic.
    """
    total_q, num_heads, head_dim = q.shape
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"the CUDA attention kernels are instantiated for head_dim in {HEAD_DIMS}, got {head_dim}")
    num_kv_heads = k_pool.shape[1]
    num_seqs = len(qo_indptr) - 1
    args = AttentionArgs(kv_dtype=KV_DTYPE_CODES[kv_dtype], head_dim=head_dim, num_heads=num_heads)
    if paged is not None:
        kv_indptr, kv_indices, kv_last_page_len, block_size = paged
        _check_blocks(kv_indices, k_pool.shape[0] // block_size, "kv_indices")
        kv_lens = (np.diff(kv_indptr.astype(np.int64)) - 1) * block_size + kv_last_page_len
        args.paged, args.block_size = 1, block_size
        args.kv_indptr, args.kv_indices = _ptr(kv_indptr, np.int32), _ptr(kv_indices, np.int32)
        args.kv_last_page_len = _ptr(kv_last_page_len, np.int32)
    else:
        kv_start, kv_lens = contiguous
        if num_seqs and int((kv_start.astype(np.int64) + kv_lens).max()) > k_pool.shape[0]:
            raise ValueError(f"kv_start + kv_len exceeds the pool's {k_pool.shape[0]} slots")
        args.paged = 0
        args.kv_start, args.kv_len = _ptr(kv_start, np.int32), _ptr(kv_lens, np.int32)
    out = np.full(q.shape, np.nan, dtype=np.float32)  # poisoned: an element the kernel misses stays NaN
    if total_q == 0:
        return out
    plan = launch.plan_attention(
        num_seqs, num_heads, num_kv_heads, int(np.diff(qo_indptr).max()), int(kv_lens.max()), PLAN_SMS,
        partition_tokens,
    )
    launch.check_pool_alignment(head_dim, k_pool.itemsize, k_pool=k_pool.ctypes.data, v_pool=v_pool.ctypes.data)
    if plan.num_partitions > 1:
        part_out = np.empty((total_q, num_heads, plan.num_partitions, head_dim), dtype=np.float32)
        part_ml = np.empty((total_q, num_heads, plan.num_partitions, 2), dtype=np.float32)
    else:
        part_out = part_ml = out  # not touched by a single-partition launch
    args.rows, args.row_chunks = plan.rows, plan.row_chunks
    args.num_partitions, args.partition_tokens = plan.num_partitions, plan.partition_tokens
    args.q, args.qo_indptr = _ptr(q, np.float32), _ptr(qo_indptr, np.int32)
    args.k_pool, args.v_pool = _ptr(k_pool), _ptr(v_pool)
    args.num_kv_heads, args.num_seqs, args.scale = num_kv_heads, num_seqs, scale
    args.out, args.part_out, args.part_ml = _ptr(out), _ptr(part_out), _ptr(part_ml)
    args.os_threads = os_threads()
    lib = _library()
    status = lib.kvw_attention(ctypes.byref(args))
    assert status == 0, "head_dim is checked above and rows come from launch.ROW_TILES"
    if plan.num_partitions > 1:
        lib.kvw_merge_partitions(
            args.part_out, args.part_ml, plan.num_partitions, head_dim, num_heads, total_q, args.out,
            launch.MERGE_THREADS, os_threads(),
        )
    return out


def _decode_indptr(num_seqs: int) -> np.ndarray:
    return np.arange(num_seqs + 1, dtype=np.int32)  # one query token per sequence


def paged_decode(q, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, block_size, kv_dtype, scale):
    """Decode attention over a CSR page table → float32 [num_seqs, num_heads, head_dim]."""
    paged = (kv_indptr, kv_indices, kv_last_page_len, block_size)
    return attention(q, _decode_indptr(q.shape[0]), k_pool, v_pool, kv_dtype, scale, paged=paged)


def contiguous_decode(q, k_pool, v_pool, kv_start, kv_len, kv_dtype, scale):
    """Decode attention over contiguous extents → float32 [num_seqs, num_heads, head_dim]."""
    contiguous = (kv_start, kv_len)
    return attention(q, _decode_indptr(q.shape[0]), k_pool, v_pool, kv_dtype, scale, contiguous=contiguous)


def paged_extend(q, qo_indptr, k_pool, v_pool, kv_indptr, kv_indices, kv_last_page_len, block_size, kv_dtype, scale):
    """Causal extend attention over a CSR page table → float32 [total_q, num_heads, head_dim]."""
    paged = (kv_indptr, kv_indices, kv_last_page_len, block_size)
    return attention(q, qo_indptr, k_pool, v_pool, kv_dtype, scale, paged=paged)


def contiguous_extend(q, qo_indptr, k_pool, v_pool, kv_start, kv_len, kv_dtype, scale):
    """Causal extend attention over contiguous extents → float32 [total_q, num_heads, head_dim]."""
    return attention(q, qo_indptr, k_pool, v_pool, kv_dtype, scale, contiguous=(kv_start, kv_len))


def cache_write(k_pool, v_pool, k_new, v_new, slot_mapping) -> None:
    """Mutates the pools: row i of k_new/v_new goes to slot slot_mapping[i]; negative slots are skipped."""
    if len(slot_mapping) and int(slot_mapping.max()) >= k_pool.shape[0]:
        raise ValueError(f"slot_mapping: slot {int(slot_mapping.max())} is outside the pool's {k_pool.shape[0]} slots")
    row_bytes = k_pool[0].nbytes if len(k_pool) else 0
    word = launch.copy_word_bytes(row_bytes, *(a.ctypes.data for a in (k_pool, v_pool, k_new, v_new)))
    row_words = row_bytes // word
    status = _library().kvw_write_cache(
        word, _ptr(k_new), _ptr(v_new), _ptr(slot_mapping, np.int64), len(slot_mapping), row_words, _ptr(k_pool),
        _ptr(v_pool), launch.copy_chunks(row_words), launch.COPY_THREADS, os_threads(),
    )
    assert status == 0, "copy word sizes come from launch.copy_word_bytes"


def block_copy(k_pool, v_pool, copies, block_size) -> None:
    """Mutates the pools: block dst gets a copy of block src for every (src, dst) row of `copies`."""
    block_swap(k_pool, v_pool, k_pool, v_pool, copies, block_size)


def block_swap(src_k, src_v, dst_k, dst_v, moves, block_size) -> None:
    """Mutates dst_k/dst_v: block dst of the dst pools gets block src of the src pools per (src, dst) row."""
    _check_blocks(moves[:, 0], src_k.shape[0] // block_size, "source blocks")
    _check_blocks(moves[:, 1], dst_k.shape[0] // block_size, "destination blocks")
    block_bytes = block_size * (src_k[0].nbytes if len(src_k) else 0)
    word = launch.copy_word_bytes(block_bytes, *(a.ctypes.data for a in (src_k, src_v, dst_k, dst_v)))
    block_words = block_bytes // word
    status = _library().kvw_copy_blocks(
        word, _ptr(src_k), _ptr(src_v), _ptr(dst_k), _ptr(dst_v), _ptr(moves, np.int32), len(moves), block_words,
        launch.copy_chunks(block_words), launch.COPY_THREADS, os_threads(),
    )
    assert status == 0, "copy word sizes come from launch.copy_word_bytes"


def _check_blocks(block_ids, num_blocks: int, what: str) -> None:
    """Raise ValueError unless every block id is in 0..num_blocks-1 (the shim would read out of bounds)."""
    if len(block_ids) and (int(block_ids.min()) < 0 or int(block_ids.max()) >= num_blocks):
        low, high = int(block_ids.min()), int(block_ids.max())
        raise ValueError(f"{what}: block ids must lie in 0..{num_blocks - 1}, got {low}..{high}")
