"""Backend `cuda-cpu`: the CUDA C kernels of `kernels/` executed on the CPU through the fiber shim.

The shim library (`kernels/cuda_cpu_entry.cpp` + `cuda_cpu_shim.h` + the unmodified .cu files) is
built with g++ on first use into a cache folder keyed by a hash of every source, the compiler and
the flags, then loaded with ctypes. Slow (every CUDA thread is a fiber): for correctness tests at
small shapes. It runs the same launch plans as the CuPy backend (`workbench.kernels.launch`) on
an H200. Linux x86-64 with g++ and a CUDA 13 toolkit's headers.
Same positional signatures as the other backends (docs/kernels.md); NumPy in, NumPy out.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import numpy as np

from workbench.kernels import cuda_launches
from workbench.kernels.source import SHIM_ENTRY, cuda_include_dirs, kernels_dir, sources_digest
from workbench.paths import REPO_ROOT

CXX = os.environ.get("CXX", "g++")
# -fsanitize=bounds: an index past a __shared__ array (or any sized array) aborts naming the file and line,
# where it would otherwise read a neighbour (cuda_cpu_shim.h)
CXX_FLAGS = ("-O1", "-std=c++17", "-shared", "-fPIC", "-pthread", "-fsanitize=bounds", "-fno-sanitize-recover=bounds")
# The order of a block's threads between barriers (cuda_cpu_shim.h): codes of kvw_set_thread_order
THREAD_ORDERS = {"index": 0, "reversed": 1, "shuffled": 2}
DEFAULT_ORDER_SEED = 0x5EED0F7EAD
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
    with open(target.parent / ".lock", "w") as lock:  # concurrent processes wait for one build, not race it
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_file():
            _compile(entry, target, include)
    return target


def _compile(entry: Path, target: Path, include: Path) -> None:
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    includes = [f"-I{kernels_dir()}", f"-I{entry.parent}", f"-I{include}"]
    command = [CXX, *CXX_FLAGS, *includes, "-x", "c++", str(entry), "-o", tmp]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(tmp)
        raise ShimBuildError(f"building the CUDA CPU shim failed:\n$ {' '.join(command)}\n{result.stderr}")
    os.replace(tmp, target)


@cache
def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build_library(kernels_dir() / SHIM_ENTRY)))
    lib.kvw_has_kernel.argtypes = [ctypes.c_char_p]
    lib.kvw_has_kernel.restype = ctypes.c_int
    lib.kvw_launch.argtypes = [
        ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int,
    ]
    lib.kvw_launch.restype = ctypes.c_int
    lib.kvw_set_thread_order.argtypes = [ctypes.c_int, ctypes.c_ulonglong]
    lib.kvw_set_thread_order.restype = None
    return lib


def set_thread_order(order: str, seed: int = DEFAULT_ORDER_SEED) -> None:
    """The order a block's threads run in between barriers for the launches that follow: "shuffled" (the
    default: a permutation drawn from `seed`, the block and the barriers passed), "reversed" or "index".
    A correct kernel gives the same bits in every order; one that reads another thread's write without a
    barrier does not."""
    if order not in THREAD_ORDERS:
        raise ValueError(f"order must be one of {sorted(THREAD_ORDERS)}, got {order!r}")
    _library().kvw_set_thread_order(THREAD_ORDERS[order], seed)


def has_kernel(name_expression: str) -> bool:
    """Whether the shim build registers the kernel the CuPy launcher would compile as `name_expression`."""
    return bool(_library().kvw_has_kernel(name_expression.encode()))


def os_threads() -> int:
    """OS threads a launch spreads its blocks over: the CPUs this process may use."""
    return len(os.sched_getaffinity(0))


_SCALAR_TYPES = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.int64): ctypes.c_int64,
                 np.dtype(np.float32): ctypes.c_float}


def run(launches: list[cuda_launches.Launch]) -> None:
    """Run each launch through the shim, as cuLaunchKernel would: one pointer to each argument's value.

    Raises ValueError when a kernel is unknown or an argument's size differs from its parameter's.
    """
    lib = _library()
    for item in launches:
        values = [_c_value(arg) for arg in item.args]  # kept alive until the launch returns
        num_args = len(values)
        pointers = (ctypes.c_void_p * num_args)(*(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values))
        sizes = (ctypes.c_int * num_args)(*(ctypes.sizeof(v) for v in values))
        error = ctypes.create_string_buffer(512)
        status = lib.kvw_launch(
            item.kernel.encode(), (ctypes.c_uint * 3)(*item.grid), (ctypes.c_uint * 3)(*item.block), pointers, sizes,
            num_args, os_threads(), error, len(error),
        )
        if status != 0:
            raise ValueError(f"cuda-cpu launch failed: {error.value.decode()}")


def _c_value(arg):
    """An array as its data pointer, a NumPy scalar as the C value of its type."""
    if isinstance(arg, np.ndarray):
        if not arg.flags.c_contiguous:
            raise ValueError("kernel arrays must be C-contiguous")
        return ctypes.c_void_p(arg.ctypes.data)
    if isinstance(arg, np.generic) and arg.dtype in _SCALAR_TYPES:
        return _SCALAR_TYPES[arg.dtype](arg.item())
    raise TypeError(f"kernel argument of unsupported type {type(arg).__name__}")


def _data_ptr(array: np.ndarray) -> int:
    return array.ctypes.data


def prepare_attention(q, qo_indptr, k_pool, v_pool, kv_dtype, scale, *, paged=None, contiguous=None,
                      partition_tokens=None, max_q_per_seq=None, window=0):
    """Extend attention (decode when every sequence has one query) through the shim, planned: returns a call
    that runs the launches and returns float32 [total_q, H, D].

    paged = (kv_indptr, kv_indices, kv_last_page_len, block_size) or contiguous = (kv_start, kv_len).
    `partition_tokens` forces a split-K partition size instead of the launcher heuristic.
    """
    if paged is not None:
        _check_blocks(paged[1], k_pool.shape[0] // paged[3], "kv_indices")
    elif len(contiguous[0]) and int((contiguous[0].astype(np.int64) + contiguous[1]).max()) > k_pool.shape[0]:
        raise ValueError(f"kv_start + kv_len exceeds the pool's {k_pool.shape[0]} slots")
    out, launches = cuda_launches.attention(
        np, q, qo_indptr, k_pool, v_pool, kv_dtype, scale, _data_ptr, PLAN_SMS, paged=paged, contiguous=contiguous,
        partition_tokens=partition_tokens, max_q_per_seq=max_q_per_seq, window=window,
    )
    return cuda_launches.launch_call(run, launches, out)


attention = cuda_launches.launched_now(prepare_attention)
prepare_paged_decode, prepare_contiguous_decode, prepare_paged_extend, prepare_contiguous_extend = \
    cuda_launches.attention_entry_points(prepare_attention, np)
paged_decode, contiguous_decode, paged_extend, contiguous_extend = map(
    cuda_launches.launched_now,
    (prepare_paged_decode, prepare_contiguous_decode, prepare_paged_extend, prepare_contiguous_extend))


def mla_decode(q_latent, q_rope, pool, kv_dtype, scale, kv_scale, *, paged=None, contiguous=None,
               selected=None) -> np.ndarray:
    """Latent attention (`workbench.kernels.mla`, validated there) through the shim."""
    out, launches = cuda_launches.mla_decode(np, q_latent, q_rope, pool, kv_dtype, scale, kv_scale, paged=paged,
                                             contiguous=contiguous, selected=selected)
    run(launches)
    return out


def cache_write(k_pool, v_pool, k_new, v_new, slot_mapping) -> None:
    """Mutates the pools: row i of k_new/v_new goes to slot slot_mapping[i]; negative slots are skipped."""
    if len(slot_mapping) and int(slot_mapping.max()) >= k_pool.shape[0]:
        raise ValueError(f"slot_mapping: slot {int(slot_mapping.max())} is outside the pool's {k_pool.shape[0]} slots")
    run(cuda_launches.cache_write(k_pool, v_pool, k_new, v_new, slot_mapping, _data_ptr))


def cache_write_fp8(k_pool, v_pool, k_new, v_new, slot_mapping, source, kv_scales) -> None:
    """Mutates the fp8 pools: row i of k_new/v_new (model dtype `source`) goes to slot slot_mapping[i] as the
    e4m3 codes of k_new / k_scale and v_new / v_scale; negative slots are skipped."""
    if len(slot_mapping) and int(slot_mapping.max()) >= k_pool.shape[0]:
        raise ValueError(f"slot_mapping: slot {int(slot_mapping.max())} is outside the pool's {k_pool.shape[0]} slots")
    run(cuda_launches.cache_write_fp8(k_pool, v_pool, k_new, v_new, slot_mapping, source, kv_scales))


def block_copy(k_pool, v_pool, copies, block_size) -> None:
    """Mutates the pools: block dst gets a copy of block src for every (src, dst) row of `copies`."""
    block_swap(k_pool, v_pool, k_pool, v_pool, copies, block_size)


def block_swap(src_k, src_v, dst_k, dst_v, moves, block_size) -> None:
    """Mutates dst_k/dst_v: block dst of the dst pools gets block src of the src pools per (src, dst) row."""
    _check_blocks(moves[:, 0], src_k.shape[0] // block_size, "source blocks")
    _check_blocks(moves[:, 1], dst_k.shape[0] // block_size, "destination blocks")
    run(cuda_launches.copy_blocks(src_k, src_v, dst_k, dst_v, moves, block_size, _data_ptr))


def _check_blocks(block_ids, num_blocks: int, what: str) -> None:
    """Raise ValueError unless every block id is in 0..num_blocks-1 (the shim would read out of bounds)."""
    if len(block_ids) and (int(block_ids.min()) < 0 or int(block_ids.max()) >= num_blocks):
        low, high = int(block_ids.min()), int(block_ids.max())
        raise ValueError(f"{what}: block ids must lie in 0..{num_blocks - 1}, got {low}..{high}")
