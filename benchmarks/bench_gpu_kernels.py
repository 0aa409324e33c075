"""GPU decode bandwidth: paged vs contiguous attention vs a read-only stream of the same bytes (docs/performance.md).

    python benchmarks/bench_gpu_kernels.py --out OUTDIR      # the table (also OUTDIR/gpu_kernels.{md,csv})
    python benchmarks/bench_gpu_kernels.py --small           # every kernel once on small shapes (for compute-sanitizer)

Shape per docs/performance.md: 32 query / 8 kv heads, head_dim 128, fp16 KV; contexts 1k-32k; block sizes
8-128; the batch is sized to about 1 GiB of KV so the device, not the launch, is measured. Paged
pools use a shuffled block table. Times are CUDA events around the kernel launches alone (plans,
buffers and argument lists are built before), median of REPEATS. The roofline is a read-only
streaming kernel over the same K and V bytes, printed beside the spec sheet's HBM bandwidth.
Before timing, each configuration checks that paged and contiguous outputs agree bit for bit
(same logical KV, same schedule).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import cupy as cp
import numpy as np

from workbench import kernels, presets
from workbench.kernels import cuda_launches, cupy_backend, fp8

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 32, 8, 128
CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
BLOCK_SIZES = (8, 16, 32, 64, 128)
TARGET_KV_BYTES = 1 << 30
REPEATS = 20

# Reads every 16-byte word of two buffers once (grid-stride) and folds them into a value that is
# stored only if it equals a sentinel, so the loads cannot be optimised away and nothing is written.
_STREAM_READ = cp.RawKernel(r"""
extern "C" __global__ void stream_read(const uint4* __restrict__ a, const uint4* __restrict__ b, long long words,
                                       unsigned sentinel, unsigned* __restrict__ sink) {
  unsigned x = 0;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < words; i += stride) {
    const uint4 u = a[i], v = b[i];
    x ^= u.x ^ u.y ^ u.z ^ u.w ^ v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == sentinel) sink[0] = x;
}
""", "stream_read")


def time_ms(fn, repeats: int = REPEATS) -> float:
    """Median milliseconds of `fn()` (kernel launches only) over `repeats` runs after two warm-ups, by CUDA events."""
    fn()
    fn()
    times = []
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def stream_read_gbps(k, v) -> float:
    """GB/s of the read-only streaming kernel over the bytes of k and v (same size, 16-byte multiples)."""
    words = k.nbytes // 16
    sink = cp.zeros(1, dtype=cp.uint32)
    sms = cupy_backend.num_sms(k.device.id)
    args = (k, v, np.int64(words), np.uint32(0x9E3779B9), sink)
    ms = time_ms(lambda: _STREAM_READ((sms * 8,), (512,), args))
    return (k.nbytes + v.nbytes) / ms / 1e6


def spec_gbps() -> tuple[str, float | None]:
    """(device name, the spec sheet's HBM GB/s from workbench.presets when the device is a known GPU)."""
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    key = name.lower().replace("nvidia ", "")
    match = next((g for g in presets.GPUS.values() if g.name.split("-")[0] in key), None)
    return name, (match.hbm_gb_s if match else None)


def decode_launches(q, k_pool, v_pool, paged=None, contiguous=None):
    """Output buffer and the launches of one decode call, planned once so that timing sees only the kernels."""
    qo_indptr = cp.arange(q.shape[0] + 1, dtype=cp.int32)
    return cuda_launches.attention(cp, q, qo_indptr, k_pool, v_pool, "fp16", HEAD_DIM**-0.5, lambda a: a.data.ptr,
                                   cupy_backend.num_sms(q.device.id), paged=paged, contiguous=contiguous,
                                   max_q_per_seq=1, blocks_per_sm=cupy_backend.blocks_per_sm)


def decode_case(context: int, block_size: int, num_seqs: int, rng):
    """Device arrays for `num_seqs` sequences of `context` tokens, paged (shuffled blocks) and contiguous."""
    blocks_per_seq = -(-context // block_size)
    num_blocks = num_seqs * blocks_per_seq
    shape = (num_seqs * context, NUM_KV_HEADS, HEAD_DIM)
    contig_k = cp.random.standard_normal(shape, dtype=cp.float32).astype(cp.float16)
    contig_v = cp.random.standard_normal(shape, dtype=cp.float32).astype(cp.float16)
    table = rng.permutation(num_blocks).astype(np.int32)  # [num_seqs * blocks_per_seq] logical -> physical
    logical = np.arange(num_seqs * blocks_per_seq * block_size).reshape(num_seqs, -1)[:, :context]
    slots = (table[logical // block_size] * block_size + logical % block_size).reshape(-1)  # physical slot of token
    paged_k = cp.zeros((num_blocks * block_size, NUM_KV_HEADS, HEAD_DIM), dtype=cp.float16)
    paged_v = cp.zeros_like(paged_k)
    slots_d = cp.asarray(slots)
    paged_k[slots_d] = contig_k
    paged_v[slots_d] = contig_v
    kv_indptr = cp.arange(0, num_blocks + 1, blocks_per_seq, dtype=cp.int32)
    kv_indices = cp.asarray(table)
    kv_last = cp.full(num_seqs, context - (blocks_per_seq - 1) * block_size, dtype=cp.int32)
    kv_start = cp.arange(0, num_seqs * context, context, dtype=cp.int32)
    kv_len = cp.full(num_seqs, context, dtype=cp.int32)
    q = cp.random.standard_normal((num_seqs, NUM_HEADS, HEAD_DIM), dtype=cp.float32)
    return q, (paged_k, paged_v, kv_indptr, kv_indices, kv_last), (contig_k, contig_v, kv_start, kv_len)


def bandwidth_table(out_dir: Path) -> None:
    rng = np.random.default_rng(0)
    device, spec = spec_gbps()
    spec_text = f"{spec:.0f} GB/s" if spec else "n/a (not in workbench.presets)"
    print(f"{device}: spec sheet HBM bandwidth {spec_text}", flush=True)
    rows = []
    for context in CONTEXTS:
        per_seq_bytes = 2 * context * NUM_KV_HEADS * HEAD_DIM * 2
        num_seqs = int(np.clip(TARGET_KV_BYTES // per_seq_bytes, 1, 256))
        for block_size in BLOCK_SIZES:
            q, paged, contig = decode_case(context, block_size, num_seqs, rng)
            pk, pv, indptr, indices, last = paged
            ck, cv, start, length = contig
            if block_size == BLOCK_SIZES[0]:  # the roofline for this context: the contiguous pools' bytes
                stream_gbps = stream_read_gbps(ck, cv)
            paged_out, paged_launches = decode_launches(q, pk, pv, paged=(indptr, indices, last, block_size))
            contig_out, contig_launches = decode_launches(q, ck, cv, contiguous=(start, length))
            cupy_backend.run(paged_launches)
            cupy_backend.run(contig_launches)
            if not bool(cp.array_equal(paged_out, contig_out)):
                sys.exit(f"paged and contiguous decode differ at context {context}, block size {block_size}")
            paged_ms = time_ms(lambda launches=paged_launches: cupy_backend.run(launches))
            contig_ms = time_ms(lambda launches=contig_launches: cupy_backend.run(launches))
            kv_bytes = kernels.kv_bytes_read(np.full(num_seqs, context), NUM_KV_HEADS, HEAD_DIM, "fp16")
            paged_gbps = kv_bytes / paged_ms / 1e6
            rows.append(dict(context=context, block_size=block_size, num_seqs=num_seqs,
                             contiguous_ms=round(contig_ms, 4), paged_ms=round(paged_ms, 4),
                             paged_over_contiguous=round(paged_ms / contig_ms, 3),
                             paged_kv_gbps=round(paged_gbps, 1),
                             contiguous_kv_gbps=round(kv_bytes / contig_ms / 1e6, 1),
                             stream_read_gbps=round(stream_gbps, 1),
                             paged_frac_of_stream=round(paged_gbps / stream_gbps, 3),
                             paged_frac_of_spec=round(paged_gbps / spec, 3) if spec else float("nan")))
            print(rows[-1], flush=True)
            del q, paged, contig, pk, pv, ck, cv, paged_out, contig_out, paged_launches, contig_launches
            cp.get_default_memory_pool().free_all_blocks()
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "gpu_kernels.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    header = "| " + " | ".join(rows[0]) + " |"
    lines = [f"{device}; spec sheet HBM {spec_text}; roofline = read-only stream of the same K/V bytes "
             f"(stream_read_gbps); fp16 KV, 32 q / 8 kv heads, head_dim 128; CUDA events around the launches",
             "", header, "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(str(v) for v in row.values()) + " |" for row in rows]
    (out_dir / "gpu_kernels.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def small_run() -> None:
    """Every kernel once on small shapes (decode, extend, split-K, each dtype, cache ops): a sanitizer workload.

    CuPy's memory pool is off, so every array is its own allocation and memcheck sees an access
    past an array's end instead of landing in a neighbour inside a pooled chunk.
    """
    cp.cuda.set_allocator(None)
    rng = np.random.default_rng(1)
    for kv_dtype, storage in (("fp32", cp.float32), ("fp16", cp.float16), ("bf16", cp.uint16), ("fp8", cp.uint8)):
        lengths = np.array([1, 17, 300])
        block_size = 16
        nblocks = -(-lengths // block_size)
        total = int(nblocks.sum())
        values = cp.random.standard_normal((total * block_size, 2, 64), dtype=cp.float32)
        if kv_dtype == "fp8":
            pool = cp.asarray(fp8.quantize(cp.asnumpy(values)))
        elif kv_dtype == "bf16":
            pool = (values.view(cp.uint32) >> 16).astype(cp.uint16)
        else:
            pool = values.astype(storage)
        indices = cp.asarray(rng.permutation(total).astype(np.int32))
        indptr = cp.asarray(np.concatenate([[0], np.cumsum(nblocks)]).astype(np.int32))
        last = cp.asarray((lengths - (nblocks - 1) * block_size).astype(np.int32))
        qo_indptr = cp.asarray(np.array([0, 1, 5, 12], dtype=np.int32))
        q = cp.random.standard_normal((12, 8, 64), dtype=cp.float32)
        for partition_tokens in (None, 64):
            cupy_backend.attention(q, qo_indptr, pool, pool, kv_dtype, 0.125,
                                   paged=(indptr, indices, last, block_size), partition_tokens=partition_tokens)
            cupy_backend.attention(q, qo_indptr, pool, pool, kv_dtype, 0.125,
                                   contiguous=(cp.zeros(3, dtype=cp.int32), cp.asarray(lengths.astype(np.int32))),
                                   partition_tokens=partition_tokens)
        copy = pool.copy()
        cupy_backend.cache_write(pool, copy, pool[:5].copy(), copy[:5].copy(), cp.asarray([3, -1, 40, 7, 9]))
        if kv_dtype == "fp8":  # the quantizing write from each model dtype
            model_rows = {"fp32": values[:5].copy(), "fp16": values[:5].astype(cp.float16),
                          "bf16": (values[:5].view(cp.uint32) >> 16).astype(cp.uint16)}
            for source, new_rows in model_rows.items():
                cupy_backend.cache_write_fp8(pool, copy, new_rows, new_rows, cp.asarray([3, -1, 40, 7, 9]), source,
                                             (0.5, 2.0))
        cupy_backend.block_copy(pool, copy, cp.asarray(np.array([[0, 2], [1, 3]], dtype=np.int32)), block_size)
        host = cp.asnumpy(pool)
        cupy_backend.block_swap(pool, copy, host, host.copy(), np.array([[0, 1]], dtype=np.int32), block_size)
    # GQA group 8 at head_dim 128 with the launcher's own split-K (a long sequence beside short ones)
    lengths = np.array([3000, 5, 700])
    nblocks = -(-lengths // 16)
    pool = cp.random.standard_normal((int(nblocks.sum()) * 16, 2, 128), dtype=cp.float32).astype(cp.float16)
    indptr = cp.asarray(np.concatenate([[0], np.cumsum(nblocks)]).astype(np.int32))
    indices = cp.asarray(rng.permutation(int(nblocks.sum())).astype(np.int32))
    last = cp.asarray((lengths - (nblocks - 1) * 16).astype(np.int32))
    q = cp.random.standard_normal((3, 16, 128), dtype=cp.float32)
    cupy_backend.paged_decode(q, pool, pool, indptr, indices, last, 16, "fp16", 128**-0.5)
    cp.cuda.Device().synchronize()
    print("small run: every kernel launched")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write gpu_kernels.md / .csv here")
    parser.add_argument("--small", action="store_true", help="run every kernel once on small shapes and exit")
    args = parser.parse_args()
    if args.small:
        small_run()
    elif args.out:
        bandwidth_table(args.out)
    else:
        parser.error("give --out OUTDIR or --small")


if __name__ == "__main__":
    main()
