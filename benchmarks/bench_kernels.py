"""CPU decode-attention benchmark (docs/performance.md): Numba paged vs contiguous vs a NumPy/BLAS baseline.

Prints tables, asserts nothing. Every timing is the best of several repeats (the machine may be
shared, so single numbers are noisy); every kernel output is checked against the float64 reference
on a few sequences before it is timed.

    python benchmarks/bench_kernels.py [--quick] [--clock cpu]
    python benchmarks/bench_kernels.py --sass    # the CUDA decode loop's registers, spills, SASS per KV byte
    python benchmarks/bench_kernels.py --sass --nvcc   # the same, built by nvcc from the same options

--clock wall (default): all Numba threads, best wall time, against the parallel read bandwidth.
--clock cpu: one thread, best process CPU time, against single-thread np.sum bandwidth. When other
jobs share the machine, a parallel call waits for its slowest (descheduled) thread, so wall
numbers swing widely; CPU time of one thread is the steadier way to compare paged with contiguous.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from workbench import kernels
from workbench.kernels import reference

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
BANDWIDTH_ARRAY_BYTES = 2 << 30  # well past any L3 (this machine reports 480 MiB)
FLUSH_BYTES = 1 << 30  # read between timed calls so each call starts with its KV out of cache
# Decode instantiations whose main loop --sass reports: GQA groups 1/4/8 at head_dim 128, each dtype.
SASS_KERNELS = [
    "kvw::paged_attention<__half, 128, 1>", "kvw::paged_attention<__half, 128, 4>",
    "kvw::paged_attention<__half, 128, 8>", "kvw::contiguous_attention<__half, 128, 4>",
    "kvw::paged_attention<__nv_bfloat16, 128, 4>", "kvw::paged_attention<float, 128, 4>",
    "kvw::paged_attention<float, 256, 8>", "kvw::paged_attention<kvw::Fp8E4M3, 128, 4>",
    "kvw::paged_attention<kvw::Fp8E4M3, 128, 8>",
]
clock = time.perf_counter  # main() switches it to time.process_time for --clock cpu
_flush = None


def _best_s(fns: dict, repeats: int) -> dict:
    """Best time (by `clock`) of each callable; rounds interleave them so that load from other users of the
    machine hits all of them alike."""
    global _flush
    if _flush is None:
        _flush = np.ones(FLUSH_BYTES // 4, dtype=np.float32)
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            _flush.sum()  # evict: otherwise whichever kernel last touched the same KV would start warm
            start = clock()
            fn()
            best[name] = min(best[name], clock() - start)
    return best


def read_bandwidth_gbps(repeats: int, threads: int) -> tuple[float, float]:
    """(np.sum over `threads` chunks in parallel threads, np.sum in one thread) over a 2 GiB float32 array, GB/s.

    np.sum releases the GIL and streams with unrolled SIMD adds; it reads faster than a plain
    Numba reduction loop here, so it is the stricter yardstick.
    """
    a = np.ones(BANDWIDTH_ARRAY_BYTES // 4, dtype=np.float32)
    chunks = np.array_split(a, threads)
    with ThreadPoolExecutor(threads) as pool:
        parallel = lambda: sum(pool.map(np.sum, chunks))
        best = _best_s({"parallel": parallel, "numpy": a.sum}, repeats)
    return a.nbytes / best["parallel"] / 1e9, a.nbytes / best["numpy"] / 1e9


def make_pools(rng, num_seqs: int, ctx: int, block_size: int):
    """The same logical fp32 KV as a packed contiguous pool and a churned paged pool: every sequence's
    blocks are a random draw from the whole pool, in random order, as a block table looks after hours
    of serving (the free list shuffled by frees), not the in-order blocks of a fresh pool."""
    total = num_seqs * ctx
    k = rng.standard_normal((total, NUM_KV_HEADS, HEAD_DIM), dtype=np.float32)  # [slots, kv heads, head_dim]
    v = rng.standard_normal((total, NUM_KV_HEADS, HEAD_DIM), dtype=np.float32)
    kv_start = (np.arange(num_seqs) * ctx).astype(np.int32)
    kv_len = np.full(num_seqs, ctx, dtype=np.int32)
    blocks_per_seq = -(-ctx // block_size)
    num_blocks = num_seqs * blocks_per_seq
    perm = rng.permutation(num_blocks).astype(np.int32)  # physical block of each logical block
    slot_of = (perm[:, None].astype(np.int64) * block_size + np.arange(block_size)).reshape(num_seqs, -1)[:, :ctx]
    paged_k = np.zeros((num_blocks * block_size, NUM_KV_HEADS, HEAD_DIM), dtype=np.float32)
    paged_v = np.zeros_like(paged_k)
    paged_k[slot_of.reshape(-1)] = k
    paged_v[slot_of.reshape(-1)] = v
    kv_indptr = (np.arange(num_seqs + 1) * blocks_per_seq).astype(np.int32)
    last = np.full(num_seqs, ctx - (blocks_per_seq - 1) * block_size, dtype=np.int32)
    return (k, v, kv_start, kv_len), (paged_k, paged_v, kv_indptr, perm, last, block_size)


def blas_decode(q, k_t, v) -> np.ndarray:
    """Batched-matmul decode: scores = q·Kᵀ, softmax, ·V (NumPy; BLAS inside when the layout allows).

    q [S, NUM_Q_HEADS, D]; k_t [S, kvh, D, ctx]; v [S, kvh, ctx, D] (views or contiguous copies).
    """
    num_seqs = q.shape[0]
    qg = q.reshape(num_seqs, NUM_KV_HEADS, NUM_Q_HEADS // NUM_KV_HEADS, HEAD_DIM)  # [S, kvh, group, D]
    scores = np.matmul(qg, k_t) * np.float32(1 / np.sqrt(HEAD_DIM))  # [S, kvh, group, ctx]
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return np.matmul(scores, v).reshape(num_seqs, NUM_Q_HEADS, HEAD_DIM)


def blas_operands(k_pool, v_pool, num_seqs: int, ctx: int, best_layout: bool):
    """(k_t, v) for `blas_decode`: strided views of the contiguous pool, or per-head contiguous copies
    (Kᵀ as [S, kvh, D, ctx], V as [S, kvh, ctx, D]; made once, not timed) where NumPy calls BLAS."""
    k_t = k_pool.reshape(num_seqs, ctx, NUM_KV_HEADS, HEAD_DIM).transpose(0, 2, 3, 1)
    v = v_pool.reshape(num_seqs, ctx, NUM_KV_HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
    return (np.ascontiguousarray(k_t), np.ascontiguousarray(v)) if best_layout else (k_t, v)


def _check(out, expected_fn, label: str) -> None:
    err = reference.rel_err(out[:2], expected_fn())
    if not err <= 1e-5:
        raise SystemExit(f"{label}: rel_err {err:.3g} against the float64 reference")


def measure(rng, num_seqs: int, ctx: int, block_size: int, repeats: int, with_blas: bool) -> dict:
    contig, paged = make_pools(rng, num_seqs, ctx, block_size)
    q = rng.standard_normal((num_seqs, NUM_Q_HEADS, HEAD_DIM), dtype=np.float32)
    run_contig = lambda: kernels.contiguous_decode(q, *contig)
    run_paged = lambda: kernels.paged_decode(q, *paged)
    scale = 1 / np.sqrt(HEAD_DIM)
    _check(run_contig(), lambda: reference.contiguous_decode(q[:2], *contig[:2], contig[2][:2], contig[3][:2],
                                                             "fp32", scale), "contiguous")
    _check(run_paged(), lambda: reference.paged_decode(q[:2], *paged[:2], paged[2][:3], paged[3], paged[4][:2],
                                                       block_size, "fp32", scale), "paged")
    row = {"num_seqs": num_seqs, "ctx": ctx, "block_size": block_size,
           "kv_bytes": kernels.kv_bytes_read(contig[3], NUM_KV_HEADS, HEAD_DIM, "fp32")}
    row.update(_best_s({"contig_s": run_contig, "paged_s": run_paged}, repeats))
    if with_blas:  # timed in rounds of their own: BLAS threads and temporaries would disturb the kernels' rounds
        expected = lambda: reference.contiguous_decode(q[:2], *contig[:2], contig[2][:2], contig[3][:2], "fp32", scale)
        for key, best_layout in [("blas_view_s", False), ("blas_best_s", True)]:
            operands = blas_operands(contig[0], contig[1], num_seqs, ctx, best_layout)
            _check(blas_decode(q, *operands), expected, key)
            row.update(_best_s({key: lambda operands=operands: blas_decode(q, *operands)}, repeats))
    return row


def measure_narrow(rng, kv_dtype: str, repeats: int) -> tuple[float, float, int]:
    """Best paged (churned) and contiguous decode times and KV bytes for fp16, bf16 or fp8 pools at the
    docs/performance.md shape."""
    (contig_k, contig_v, kv_start, kv_len), (paged_k, paged_v, kv_indptr, kv_indices, last, block_size) = make_pools(
        rng, 32, 1024, 16)
    if kv_dtype == "fp16":
        narrow = lambda pool: pool.astype(np.float16)
    elif kv_dtype == "fp8":  # e4m3 codes, per-tensor scale 1
        from workbench.kernels import fp8  # here, so that --sass also runs against checkouts without fp8

        narrow = fp8.quantize
    else:  # bf16 by truncation: the top half of each float32
        narrow = lambda pool: (pool.view(np.uint32) >> 16).astype(np.uint16)
    paged_k, paged_v, contig_k, contig_v = (narrow(p) for p in (paged_k, paged_v, contig_k, contig_v))
    q = rng.standard_normal((32, NUM_Q_HEADS, HEAD_DIM), dtype=np.float32)
    args = (q, paged_k, paged_v, kv_indptr, kv_indices, last, block_size)
    out = kernels.paged_decode(*args, kv_dtype=kv_dtype)
    expected = reference.paged_decode(q[:2], paged_k, paged_v, kv_indptr[:3], kv_indices, last[:2], block_size,
                                      kv_dtype, 1 / np.sqrt(HEAD_DIM))
    if not reference.rel_err(out[:2], expected) <= 1e-5:
        raise SystemExit(f"{kv_dtype}: rel_err against the float64 reference too large")
    contig = lambda: kernels.contiguous_decode(q, contig_k, contig_v, kv_start, kv_len, kv_dtype=kv_dtype)
    if not np.array_equal(contig().view(np.uint32), out.view(np.uint32)):
        raise SystemExit(f"{kv_dtype}: paged and contiguous decode differ")
    best = _best_s({"paged": lambda: kernels.paged_decode(*args, kv_dtype=kv_dtype), "contig": contig}, repeats)
    kv_bytes = kernels.kv_bytes_read(np.full(32, 1024), NUM_KV_HEADS, HEAD_DIM, kv_dtype)
    return best["paged"], best["contig"], kv_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and a smaller sweep")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="see the module docstring")
    parser.add_argument("--sass", action="store_true",
                        help="print the CUDA attention loop's SASS cost (NVRTC + cuobjdump, no GPU) and exit")
    parser.add_argument("--nvcc", action="store_true", help="with --sass: compile with nvcc (same options as NVRTC)")
    args = parser.parse_args()
    if args.sass:
        import sass_loop

        nvcc = sass_loop.find_tool("nvcc") if args.nvcc else None
        if args.nvcc and nvcc is None:
            raise SystemExit("--nvcc: nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
        sass_loop.print_table(SASS_KERNELS, nvcc=nvcc)
        return
    repeats = 3 if args.quick else 7
    rng = np.random.default_rng(0)
    global clock
    if args.clock == "cpu":
        clock = time.process_time
        numba.set_num_threads(1)
    threads = numba.get_num_threads()

    parallel_gbps, numpy_gbps = read_bandwidth_gbps(repeats, threads)
    print(f"clock: {args.clock} ({'best process CPU time' if args.clock == 'cpu' else 'best wall time'}), "
          f"{threads} Numba thread(s), best of {repeats}")
    print(f"memory read bandwidth ({BANDWIDTH_ARRAY_BYTES >> 30} GiB float32 array):")
    print(f"  np.sum over {threads} chunks in {threads} thread(s): {parallel_gbps:6.1f} GB/s")
    print(f"  np.sum in one thread:                {numpy_gbps:6.1f} GB/s")
    read_gbps = parallel_gbps if args.clock == "wall" else numpy_gbps
    print(f"  reference for the kernel: {read_gbps:.1f} GB/s")

    row = measure(rng, 32, 1024, 16, repeats, with_blas=True)
    gbps = row["kv_bytes"] / row["paged_s"] / 1e9
    print("\ndocs/performance.md shape: fp32 decode, 32 seqs x 1024 ctx, 32 q / 8 kv heads, head_dim 128, block 16, "
          "churned block table")
    print(f"  KV read per call: {row['kv_bytes'] / 1e6:.0f} MB")
    print(f"  numba paged                {row['paged_s'] * 1e3:8.2f} ms  {gbps:6.1f} GB/s  "
          f"= {gbps / read_gbps:5.1%} of read bandwidth (target >= 50%)")
    contig_gbps = row["kv_bytes"] / row["contig_s"] / 1e9
    print(f"  numba contiguous           {row['contig_s'] * 1e3:8.2f} ms  {contig_gbps:6.1f} GB/s")
    for key, label in [("blas_view_s", "NumPy matmul, pool views"), ("blas_best_s", "NumPy matmul, BLAS layout")]:
        print(f"  {label:<26} {row[key] * 1e3:8.2f} ms  {row['kv_bytes'] / row[key] / 1e9:6.1f} GB/s")
    print("    (pool views: strided, NumPy falls back from BLAS; BLAS layout: per-head contiguous Kᵀ and V copies,")
    print("     made once and not timed, the strongest NumPy baseline)")
    print(f"  paged / contiguous = {row['paged_s'] / row['contig_s']:.3f} (target <= 1.10); "
          f"paged / BLAS layout = {row['paged_s'] / row['blas_best_s']:.3f} (target <= 1.00)")

    contexts = [128, 1024, 8192] if args.quick else [128, 512, 1024, 2048, 4096, 8192]
    print("\nsweep: 32768 KV tokens per call (num_seqs = 32768 / ctx), fp32, times in ms, best of", repeats)
    header = ["ctx", "seqs", "block", "contig_ms", "paged_ms", "paged/contig", "paged_GB/s"]
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, [6, 5, 5, 10, 9, 12, 10], strict=True)))
    for ctx in contexts:
        for block_size in [1, 8, 16, 32, 128]:
            row = measure(rng, 32768 // ctx, ctx, block_size, repeats, with_blas=False)
            print(f"{ctx:>6} {row['num_seqs']:>5} {block_size:>5} {row['contig_s'] * 1e3:>10.2f} "
                  f"{row['paged_s'] * 1e3:>9.2f} {row['paged_s'] / row['contig_s']:>12.3f} "
                  f"{row['kv_bytes'] / row['paged_s'] / 1e9:>10.1f}")
    print("\nother KV dtypes at the docs/performance.md shape (churned paged vs contiguous, block 16; fewer KV bytes, "
          "decoded in-kernel):")
    for kv_dtype in ["fp16", "bf16", "fp8"]:
        paged_s, contig_s, kv_bytes = measure_narrow(rng, kv_dtype, repeats)
        print(f"  {kv_dtype}: paged {paged_s * 1e3:8.2f} ms  {kv_bytes / paged_s / 1e9:6.1f} GB/s; contiguous "
              f"{contig_s * 1e3:8.2f} ms; paged / contiguous = {paged_s / contig_s:.3f} (target <= 1.10)")
    print("\nnumbers are noisy on a shared machine; compare ratios taken within one run")


if __name__ == "__main__":
    main()
