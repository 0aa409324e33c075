"""Compile everything the timed GPU steps will run, before they run: benchmarks/gpu_check.sh step 2.

    python benchmarks/gpu_warmup.py [--workers N]

Cold, each CUDA instantiation costs NVRTC 1.3-2.1 s and the Numba twin a long first compile; inside
the GPU tests' time limit that reads as a hang. Here every kernel name a launcher can ask for is
compiled through the CuPy backend's own cached compile (the same code text, options and name
expression, so CuPy's disk cache serves the tests), spread over worker processes, while one more
process compiles the Numba attention for every KV dtype (one process: Numba's cache index of a
function is rewritten per compiled signature, so parallel writers would drop each other's entries).
A compile error fails the step: the tests would fail on it too.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the source tree, as gpu_check.sh runs it

KV_DTYPES = ("fp32", "fp16", "bf16", "fp8")


def cuda_kernels() -> list[tuple[str, str]]:
    """(source file, name expression) of every kernel the CUDA launchers can ask for."""
    from workbench.kernels import source

    attention = [(source.ATTENTION_CU, name) for name in source.all_attention_kernel_names()]
    cache_ops = [(source.CACHE_OPS_CU, name) for name in source.cache_kernel_names()]
    return attention + [(source.ATTENTION_CU, source.MERGE_KERNEL_NAME)] + cache_ops


def compile_cuda(source_name: str, name_expression: str) -> float:
    """Seconds to compile (or load from CuPy's cache) one kernel."""
    from workbench.kernels import cupy_backend

    t0 = time.perf_counter()
    cupy_backend.compile_kernel(source_name, name_expression)
    return time.perf_counter() - t0


def compile_numba() -> float:
    """Seconds to compile the Numba attention for each KV dtype at the argument types the GPU tests pass."""
    import numpy as np

    from workbench import kernels
    from workbench.engine.kvpool import STORAGE_DTYPES

    t0 = time.perf_counter()
    num_blocks, block_size = 65, 16  # 1,040 positions: long enough that the twin splits KV and merges
    q = np.zeros((1, 2, 64), dtype=np.float32)
    indptr = np.array([0, num_blocks], dtype=np.int32)
    indices = np.arange(num_blocks, dtype=np.int32)
    last = np.array([block_size], dtype=np.int32)
    for kv_dtype in KV_DTYPES:
        pool = np.zeros((num_blocks * block_size, 1, 64), dtype=STORAGE_DTYPES[kv_dtype])
        kernels.paged_decode(q, pool, pool, indptr, indices, last, block_size, backend="numba", kv_dtype=kv_dtype)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="compile processes (default: CPUs)")
    args = parser.parse_args()
    names = cuda_kernels()
    t0 = time.perf_counter()
    # spawn: a forked child would share the parent's CUDA state; each worker makes its own context
    with ProcessPoolExecutor(max(1, args.workers), mp_context=multiprocessing.get_context("spawn")) as pool:
        numba_job = pool.submit(compile_numba)
        jobs = [pool.submit(compile_cuda, source_name, name) for source_name, name in names]
        seconds = [job.result() for job in jobs]
        numba_s = numba_job.result()
    print(f"warm-up: {len(names)} CUDA kernels ready (slowest {max(seconds):.1f} s, {sum(seconds):.0f} s of "
          f"compiling over {args.workers} processes); Numba attention for {', '.join(KV_DTYPES)} in {numba_s:.0f} s; "
          f"{time.perf_counter() - t0:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
