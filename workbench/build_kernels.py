"""Build the CPU backends' compiled kernels ahead of use: `python -m workbench.build_kernels`.

Both are otherwise built on first use and cached on disk: the `cuda-cpu` shim library by g++ (about half
a minute, `cuda_cpu.cache_dir()`) and the Numba kernels (`NUMBA_CACHE_DIR`). Processes that start
together with cold caches (test workers, sweep workers) would each compile the Numba kernels and queue on
the shim's build lock. `python -m workbench.build_kernels` builds both side by side, the Numba step loops in
a second process; `make test` compiles the Numba part before the tests start and lets the shim build beside
it (`... build_kernels shim`). A second run finds both cached and returns at once.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

import numpy as np

from workbench import kernels
from workbench.kernels import cuda_cpu
from workbench.paths import pythonpath_with_package

KV_DTYPES = ("fp32", "fp16", "bf16", "fp8")
TINY_MODEL = "custom:layers=2,kv_heads=2,heads=4,head_dim=16,max_model_len=512"
HYBRID_MODEL = "gpt-oss-20b"  # a full-attention and a sliding-window layer group: the hybrid pool
STORAGE = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16, "fp8": np.uint8}


def compile_numba() -> None:
    """Call every Numba entry point once on a tiny case, so each specialization is compiled and cached:
    attention (paged and contiguous, decode and extend, with and without a window) and the cache kernels
    (a write per KV dtype, the fp8 write from each model dtype, block copy and swap)."""
    block_size, num_blocks, heads, kv_heads, head_dim = 4, 4, 2, 1, 16
    slots = block_size * num_blocks
    q = np.zeros((2, heads, head_dim), np.float32)
    indptr, indices = np.array([0, 1, 2], np.int32), np.array([0, 1], np.int32)
    last_page, starts, lens = np.array([2, 2], np.int32), np.array([0, 8], np.int32), np.array([2, 2], np.int32)
    qo = np.array([0, 1, 2], np.int32)
    for kv_dtype in KV_DTYPES:
        k = np.zeros((slots, kv_heads, head_dim), STORAGE[kv_dtype])
        v = np.zeros_like(k)
        common = dict(backend="numba", kv_dtype=kv_dtype)
        for window in (0, 1):
            kernels.paged_decode(q, k, v, indptr, indices, last_page, block_size, window=window, **common)
            kernels.contiguous_decode(q, k, v, starts, lens, window=window, **common)
            kernels.paged_extend(q, qo, k, v, indptr, indices, last_page, block_size, window=window, **common)
            kernels.contiguous_extend(q, qo, k, v, starts, lens, window=window, **common)
        mapping = np.array([0, 1], np.int64)
        if kv_dtype == "fp8":
            for model_dtype in ("fp32", "fp16", "bf16"):
                new = np.zeros((2, kv_heads, head_dim), STORAGE[model_dtype])
                kernels.cache_write(k, v, new, new, mapping, backend="numba")
        else:
            new = np.zeros((2, kv_heads, head_dim), STORAGE[kv_dtype])
            kernels.cache_write(k, v, new, new, mapping, backend="numba")
        long_k = np.zeros((4096, kv_heads, head_dim), STORAGE[kv_dtype])  # one long context: split-K and its merge
        kernels.contiguous_decode(q[:1], long_k, long_k, np.array([0], np.int32), np.array([4096], np.int32),
                                  **common)
        kernels.block_copy(k, v, np.array([[0, 1]], np.int32), block_size, backend="numba")
        kernels.block_swap(k, v, np.zeros_like(k), np.zeros_like(v), np.array([[0, 1]], np.int32), block_size,
                           backend="numba")


def compile_allocators() -> None:
    """A tiny run of every registered strategy with Numba kernels: compiles the strategies' own Numba loops
    (block tables, extents, prefix keys, the batch check) and the engine's calls of the kernels."""
    from workbench.allocators import registry
    from workbench.config import RunConfig
    from workbench.engine.simulation import run

    for name in registry.names():
        run(RunConfig(strategy=name, model=TINY_MODEL, kv_slots=32768, kernel="numba", kv_dtype="fp16",
                      workload="system-prompt:k=2,system=40,lengths=alpaca", num_requests=4))
    # the hybrid pool (a model with a sliding-window group) and its prefix cache: their own compiled loops
    run(RunConfig(strategy="paged-prefix", model=HYBRID_MODEL, max_model_len=1024, kv_gib=0.06, kernel="none",
                  workload="system-prompt:k=2,system=40,lengths=alpaca", num_requests=4))
    # the integrity pass the tests run after every step (a run itself never checks)
    registry.create("paged", capacity_slots=64, block_size=16, max_model_len=64).check_integrity()


def compile_step_loops() -> None:
    """Without a kernel, plain `paged`, `paged-prefix` and `virtual-contiguous` take the compiled step loop
    (workbench.engine.compiled_paged), one specialization each: compiled here once, not by every process that
    first runs it."""
    from workbench.config import RunConfig
    from workbench.engine.simulation import run

    for name in ("paged", "paged-prefix", "virtual-contiguous"):
        run(RunConfig(strategy=name, model=TINY_MODEL, kv_slots=32768, kernel="none", num_requests=4))


def compile_prefix_index() -> None:
    """The hash index's and LRU order's compiled loops that a tiny run does not reach (eviction, a grown
    table, the integrity walk, a tree's restore): one pass through each on a tiny index."""
    from workbench.allocators.prefix import take_release
    from workbench.allocators.prefix.eviction import LRUPolicy
    from workbench.allocators.prefix.hash_index import MIN_SLOTS, HashPrefixIndex

    index = HashPrefixIndex()
    keys = np.arange(1, MIN_SLOTS + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # enough to grow the table
    blocks = np.arange(keys.shape[0], dtype=np.int32)
    index.insert(np.zeros_like(keys), keys, blocks, blocks - 1)
    index.lookup(keys, 4)
    index.block_of(int(keys[0]))
    index.release(blocks)
    index.claim(blocks[:2])
    index.evict_keyed(4)
    index.check_integrity(np.zeros(keys.shape[0], dtype=np.int32), np.zeros(0, dtype=np.int32))
    policy = LRUPolicy()
    policy.add_many(blocks[:4])
    policy.touch(1)
    policy.remove(2)
    policy.restore(2)
    policy.pop_victim()
    # a compiled take that evicts, and a release (prefix.take_release): a fresh index holding two registered blocks
    fresh = HashPrefixIndex()
    fresh.insert(np.zeros(2, dtype=np.uint64), keys[:2], blocks[:2], np.array([-1, 0], dtype=np.int32))
    slot_key, slot_block, next_copy, registered, key_of, lru = fresh.one_call_view(4, 0)
    free_ids = np.zeros(4, dtype=np.int32)
    size = take_release.release_to_cache(blocks[:4], registered, *lru, free_ids, 0, np.empty(4, dtype=np.int32))
    take_release.take_evicting(np.empty(size + 1, dtype=np.int32), free_ids, size, *lru, slot_key, slot_block,
                               next_copy, registered, key_of)


PARTS = ("numba", "shim")
# "numba" compiles the step loops in a second process beside the rest (a third of its compile time, on the other
# core); `python -m workbench.build_kernels step-loops` is that process
STEP_LOOPS = "step-loops"


def build(parts: tuple[str, ...] = PARTS) -> dict[str, float]:
    """Build `parts`: "numba" (every Numba specialization, the step loops in a second process) and "shim" (the
    cuda-cpu library, where this machine can build it: g++ and CUDA headers), the shim on a thread while the
    Numba kernels compile on this one; "step-loops" compiles the step loops alone, in this process. Returns
    seconds per part built ("numba" and "shim"); raises what a build raised."""
    took: dict[str, float] = {}
    failed: list[BaseException] = []

    def build_shim() -> None:
        t0 = time.perf_counter()
        try:
            cuda_cpu.build_library(cuda_cpu.kernels_dir() / cuda_cpu.SHIM_ENTRY)
        except BaseException as exc:  # re-raised on the main thread
            failed.append(exc)
        took["cuda-cpu shim"] = time.perf_counter() - t0

    thread = None
    if "shim" in parts and "cuda-cpu" in kernels.available_backends() and _shim_headers():
        thread = threading.Thread(target=build_shim, name="shim-build")
        thread.start()
    if STEP_LOOPS in parts:
        compile_step_loops()
    if "numba" in parts:
        t0 = time.perf_counter()
        loops = subprocess.Popen([sys.executable, "-m", "workbench.build_kernels", STEP_LOOPS],
                                 env={**os.environ, "PYTHONPATH": pythonpath_with_package()})
        try:
            compile_numba()  # the attention kernels first: the step loops share none of their code
            compile_allocators()
            compile_prefix_index()
        finally:
            status = loops.wait()
        if status != 0:
            failed.append(RuntimeError(f"compiling the step loops (python -m workbench.build_kernels {STEP_LOOPS}) "
                                       f"exited with status {status}"))
        took["numba"] = time.perf_counter() - t0
    if thread is not None:
        thread.join()
    if failed:
        raise failed[0]
    return took


def _shim_headers() -> bool:
    try:
        cuda_cpu.shim_include_dir()
    except cuda_cpu.ShimBuildError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.build_kernels", description=__doc__.splitlines()[0])
    parser.add_argument("parts", nargs="*", choices=(*PARTS, STEP_LOOPS),
                        help="what to build (default: both, side by side)")
    args = parser.parse_args(argv)
    try:
        took = build(tuple(args.parts) or PARTS)
    except cuda_cpu.ShimBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if took:
        print("kernels built: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in took.items()),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
