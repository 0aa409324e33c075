"""Random attention cases with the same logical KV laid out paged and contiguous.

Every pool slot no sequence owns holds NaN (in its storage dtype), so a kernel that reads one
wrong slot (a bad block id, the unused tail of a last page, a gap between extents) produces NaN,
and NaN never passes `rel_err`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench.kernels import fp8

KV_DTYPES = ("fp32", "fp16", "bf16", "fp8")
BF16_NAN_BITS = np.uint16(0x7FC0)
STORAGE_DTYPE = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16, "fp8": np.uint8}
# The kernel and the float64 reference see the same inputs: q is float32 in both, and the reference
# dequantizes the very K/V bits the pool stores, so rounding the KV dtype adds no error to compare.
# What is left is the kernel's float32 arithmetic: products and sums over head_dim and the context,
# exponentials (ex2.approx on a GPU: ~2 ulp) and the normalisation, a few dozen unit roundoffs of
# float32 in relative norm (measured: ~2e-7). Every KV dtype gets that bound; an error of the size
# fp16 rounding would cause (1e-3) or one token too many at 8k context (test_reference) fails it.
F32_UNIT_ROUNDOFF = 2.0**-24
TOLERANCE = dict.fromkeys(KV_DTYPES, 64 * F32_UNIT_ROUNDOFF)


def to_storage(x: np.ndarray, kv_dtype: str, kv_scale: float = 1.0) -> np.ndarray:
    """float32 values → the pool's storage dtype (bf16: round to nearest even, kept as uint16 bits;
    fp8: e4m3 codes of x / kv_scale)."""
    if kv_dtype == "fp8":
        return fp8.quantize(x, kv_scale)
    if kv_dtype == "bf16":
        bits = x.astype(np.float32).view(np.uint32)
        rounded = bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))
        return (rounded >> 16).astype(np.uint16)
    return x.astype(STORAGE_DTYPE[kv_dtype])


def e4m3_edge_values() -> np.ndarray:
    """float32 [n]: every e4m3 value, every midpoint between neighbours (ties) and the floats one and two ulps
    either side of both, the subnormal / normal / saturation boundaries, ±0, ±inf, NaN, float32 subnormals."""
    grid = fp8.E4M3_VALUES[:0x7F].astype(np.float64)  # [127] non-negative finite, ascending
    mids = (grid[:-1] + grid[1:]) / 2
    special = [2.0**-10, 2.0**-9, 2.0**-6, 448.0, 464.0, 480.0, 512.0, 1e30, np.inf, 2.0**-127, 2.0**-149, 1e-38]
    centres = np.concatenate([grid, mids, special]).astype(np.float32)
    near = [centres]
    for steps in (1, 2):
        up, down = centres.copy(), centres.copy()
        for _ in range(steps):
            up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(0))
        near += [up, down]
    values = np.concatenate(near)
    return np.concatenate([values, -values, [np.nan, -np.nan, np.float32(0)]]).astype(np.float32)


def sample_f32(rng, n: int) -> np.ndarray:
    """Random float32 bit patterns (every exponent, NaN payloads included) and the edge values."""
    return np.concatenate([rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32),
                           e4m3_edge_values()])


def fp8_write_rows(source: str, rng) -> np.ndarray:
    """Every fp16 or bf16 bit pattern, or a float32 sample, as rows [T, 2, 64] (zero-padded)."""
    if source == "fp32":
        flat = sample_f32(rng, 1 << 17)
    else:
        bits = np.arange(1 << 16, dtype=np.uint16)
        flat = bits.view(np.float16) if source == "fp16" else bits
    row_elems = 2 * 64
    padded = np.zeros(-(-len(flat) // row_elems) * row_elems, dtype=flat.dtype)
    padded[: len(flat)] = flat
    return padded.reshape(-1, 2, 64)


def poisoned_pool(num_slots: int, num_kv_heads: int, head_dim: int, kv_dtype: str) -> np.ndarray:
    pool = np.empty((num_slots, num_kv_heads, head_dim), dtype=STORAGE_DTYPE[kv_dtype])
    pool[...] = {"bf16": BF16_NAN_BITS, "fp8": fp8.E4M3_NAN_BITS}.get(kv_dtype, np.nan)
    return pool


@dataclass
class Case:
    q: np.ndarray  # float32 [num_q, num_heads, head_dim]
    kv_dtype: str
    block_size: int
    paged_k: np.ndarray  # [num_blocks * block_size, num_kv_heads, head_dim]
    paged_v: np.ndarray
    kv_indptr: np.ndarray  # int32 [num_seqs + 1]
    kv_indices: np.ndarray  # int32 [nnz_blocks]
    kv_last_page_len: np.ndarray  # int32 [num_seqs]
    contig_k: np.ndarray  # [num_slots, num_kv_heads, head_dim]
    contig_v: np.ndarray
    kv_start: np.ndarray  # int32 [num_seqs]
    kv_len: np.ndarray  # int32 [num_seqs]


def make_case(rng, kv_lens, num_heads, num_kv_heads, head_dim, block_size, kv_dtype, num_q=None) -> Case:
    """`num_q` None: one query per sequence (decode); else the number of query rows in total."""
    kv_lens = np.asarray(kv_lens, dtype=np.int64)
    num_seqs = len(kv_lens)
    nblocks = (kv_lens + block_size - 1) // block_size  # [num_seqs]
    total_blocks = int(nblocks.sum()) + 3  # spare blocks stay poisoned
    perm = rng.permutation(total_blocks).astype(np.int32)  # random, non-contiguous block tables
    kv_indptr = np.concatenate([[0], np.cumsum(nblocks)]).astype(np.int32)
    kv_indices = perm[: kv_indptr[-1]].copy()
    kv_last_page_len = (kv_lens - (nblocks - 1) * block_size).astype(np.int32)

    gaps = rng.integers(0, 4, size=num_seqs)  # poisoned slots before each extent
    kv_start = (np.cumsum(gaps) + np.concatenate([[0], np.cumsum(kv_lens)[:-1]])).astype(np.int32)
    num_contig_slots = int(kv_start[-1] + kv_lens[-1]) + 2

    paged_k = poisoned_pool(total_blocks * block_size, num_kv_heads, head_dim, kv_dtype)
    paged_v = poisoned_pool(total_blocks * block_size, num_kv_heads, head_dim, kv_dtype)
    contig_k = poisoned_pool(num_contig_slots, num_kv_heads, head_dim, kv_dtype)
    contig_v = poisoned_pool(num_contig_slots, num_kv_heads, head_dim, kv_dtype)
    for seq, kv_len in enumerate(kv_lens):
        k = to_storage(rng.standard_normal((kv_len, num_kv_heads, head_dim), dtype=np.float32), kv_dtype)
        v = to_storage(rng.standard_normal((kv_len, num_kv_heads, head_dim), dtype=np.float32), kv_dtype)
        blocks = kv_indices[kv_indptr[seq] : kv_indptr[seq + 1]].astype(np.int64)
        slots = (blocks[:, None] * block_size + np.arange(block_size)).reshape(-1)[:kv_len]
        paged_k[slots], paged_v[slots] = k, v
        contig_k[kv_start[seq] : kv_start[seq] + kv_len] = k
        contig_v[kv_start[seq] : kv_start[seq] + kv_len] = v
    rows = num_seqs if num_q is None else num_q
    q = rng.standard_normal((rows, num_heads, head_dim), dtype=np.float32)
    return Case(q, kv_dtype, block_size, paged_k, paged_v, kv_indptr, kv_indices, kv_last_page_len,
                contig_k, contig_v, kv_start, kv_lens.astype(np.int32))


def random_qo_indptr(rng, kv_lens) -> np.ndarray:
    """int32 [num_seqs + 1]: each sequence gets 1..kv_len new query tokens."""
    num_q = [int(rng.integers(1, min(int(n), 40) + 1)) for n in kv_lens]
    return np.concatenate([[0], np.cumsum(num_q)]).astype(np.int32)


def assert_attention_close(out, expected, kv_dtype: str, qo_indptr) -> None:
    """Every element written and finite, and each sequence's rows within the docs/kernels.md tolerance."""
    assert out.shape == expected.shape and out.dtype == np.float32, (out.shape, out.dtype)
    assert np.isfinite(expected).all(), "reference read a poisoned slot"
    bad = np.argwhere(~np.isfinite(out))
    assert bad.size == 0, f"{len(bad)} unwritten or NaN elements, first at {bad[0].tolist() if len(bad) else None}"
    from workbench.kernels.reference import rel_err

    for seq in range(len(qo_indptr) - 1):
        rows = slice(int(qo_indptr[seq]), int(qo_indptr[seq + 1]))
        err = rel_err(out[rows], expected[rows])
        assert err <= TOLERANCE[kv_dtype], f"sequence {seq}: rel_err {err:.3g} > {TOLERANCE[kv_dtype]}"
