"""Launch configurations of the CUDA kernels, shared by the CuPy launcher and the CPU shim backend.

Pure integer arithmetic, so both backends run the same grids and the heuristics are testable on the CPU.
The constants mirror `kernels/attention.cu` and `kernels/cache_ops.cu`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workbench.intmath import cdiv
from workbench.kernels.source import ROW_TILES

ATTN_THREADS = 128  # threads per attention block (kernels/attention.cu)
MERGE_THREADS = 64  # threads per merge_partitions block
MLA_THREADS = 128  # threads per latent attention block (kernels/mla_attention.cu)
MLA_HEADS = 8  # query heads per latent attention block
COPY_THREADS = 128  # threads per write_cache / copy_blocks block
MIN_PARTITION_TOKENS = 256  # split-K never cuts a sequence into pieces shorter than this
PARTITION_ALIGN_TOKENS = 64
MAX_SPLITS = 64  # split-K considers cutting the longest span into at most this many pieces
# What one more partition costs, in KV positions of a block's loop: the partial result's write and read
# and the merge launch. A modelled constant (never measured on a GPU): it only breaks near-ties toward
# fewer pieces.
SPLIT_COST_TOKENS = 32
# Resident attention blocks per SM when the launcher cannot ask the device (the CPU shim): what
# ptxas's ~160 registers per thread allow on an sm_90 SM (65536 registers / (160 x 128 threads)).
DEFAULT_BLOCKS_PER_SM = 3
# Per-SM limits of sm_80/sm_90 for `occupancy_blocks_per_sm` when the device does not say.
SM_REGISTERS, SM_THREADS, SM_MAX_BLOCKS, REGISTER_ALLOC_UNIT = 65536, 2048, 32, 256
COPY_WORDS_PER_BLOCK = 4096  # copy kernels give each CUDA block about this many words
MAX_GRID_YZ = 65535


@dataclass(frozen=True)
class AttentionPlan:
    """Grid of one attention launch: (num_kv_heads * row_chunks, num_partitions, num_seqs) x ATTN_THREADS."""

    rows: int  # (query token, query head) rows per block: the ROWS template argument
    row_chunks: int  # blocks per (sequence, kv head) along the rows
    num_partitions: int  # KV partitions (split-K); 1 = no merge step
    partition_tokens: int  # KV positions per partition

    def grid(self, num_kv_heads: int, num_seqs: int) -> tuple[int, int, int]:
        return (num_kv_heads * self.row_chunks, self.num_partitions, num_seqs)


def plan_attention(
    num_heads: int,
    num_kv_heads: int,
    max_q_per_seq: int,
    span_tokens,
    num_sms: int,
    partition_tokens: int | None = None,
    blocks_per_sm: int = DEFAULT_BLOCKS_PER_SM,
) -> AttentionPlan:
    """Rows per block, row chunks and split-K partitions for one decode (max_q_per_seq = 1) or extend launch.

    `span_tokens` [num_seqs] holds the KV positions each sequence's blocks read (its length, or less under
    a sliding window). A block serves up to 8 rows: the whole GQA group in decode (rounded up to a power
    of two), and several query tokens times the group in extend. Split-K is sized by wave efficiency over
    the real spans (`split_k_tokens`), so one long sequence among short ones is cut up even when the
    unsplit grid already fills the device. `partition_tokens` overrides the heuristic (tests use it to
    exercise the merge on small shapes).
    """
    spans = np.maximum(np.asarray(span_tokens, dtype=np.int64), 1)
    num_seqs = len(spans)
    rows = plan_rows(num_heads, num_kv_heads, max_q_per_seq)
    row_chunks = math.ceil(max_q_per_seq * (num_heads // num_kv_heads) / rows)
    max_span = int(spans.max()) if num_seqs else 1
    if partition_tokens is None:
        partition_tokens = split_k_tokens(num_kv_heads * row_chunks, spans, blocks_per_sm * num_sms)
    if partition_tokens < 1:
        raise ValueError(f"partition_tokens must be >= 1, got {partition_tokens}")
    num_partitions = max(1, math.ceil(max_span / partition_tokens))
    if num_partitions > MAX_GRID_YZ or num_seqs > MAX_GRID_YZ:
        raise ValueError(f"attention grid too large: {num_partitions} partitions x {num_seqs} sequences (max 65535)")
    return AttentionPlan(rows, row_chunks, num_partitions, partition_tokens)


def plan_rows(num_heads: int, num_kv_heads: int, max_q_per_seq: int) -> int:
    """Rows per block (the ROWS template argument): the smallest row tile holding the longest sequence's rows."""
    num_rows = max_q_per_seq * (num_heads // num_kv_heads)  # rows of the longest sequence per kv head
    return next((r for r in ROW_TILES if r >= num_rows), ROW_TILES[-1])


def modeled_time_tokens(blocks_per_seq: int, spans: np.ndarray, tokens: int, slots: int) -> int:
    """Time of an attention launch in KV positions of one block's loop when each sequence's span is cut into
    pieces of `tokens`: waves of `slots` resident blocks, each wave as long as a full piece (the blocks past
    a sequence's span exit at once and are not counted), plus SPLIT_COST_TOKENS per extra piece."""
    pieces = cdiv(spans, tokens)  # [num_seqs]
    blocks = blocks_per_seq * int(pieces.sum())
    waves = cdiv(blocks, slots)
    return waves * min(tokens, int(spans.max())) + SPLIT_COST_TOKENS * (int(pieces.max()) - 1)


def split_k_tokens(blocks_per_seq: int, spans: np.ndarray, slots: int) -> int:
    """KV positions per partition: the candidate with the least `modeled_time_tokens` (ties: fewer pieces).

    Candidates cut the longest span into n = 1..MAX_SPLITS equal pieces, rounded up to PARTITION_ALIGN_TOKENS
    and never shorter than MIN_PARTITION_TOKENS, so the last piece is no runt. `blocks_per_seq`: blocks per
    sequence and piece (kv heads x row chunks); `slots`: blocks resident on the device at once."""
    max_span = int(spans.max())
    best_tokens, best_time = max_span, modeled_time_tokens(blocks_per_seq, spans, max_span, slots)
    for n in range(2, MAX_SPLITS + 1):
        tokens = max(MIN_PARTITION_TOKENS, cdiv(cdiv(max_span, n), PARTITION_ALIGN_TOKENS) * PARTITION_ALIGN_TOKENS)
        if tokens >= max_span:
            continue
        time = modeled_time_tokens(blocks_per_seq, spans, tokens, slots)
        if time < best_time:
            best_tokens, best_time = tokens, time
        if tokens == MIN_PARTITION_TOKENS:
            break
    return best_tokens


def occupancy_blocks_per_sm(registers: int, shared_bytes: int, sm_shared_bytes: int, threads: int = ATTN_THREADS,
                            sm_registers: int = SM_REGISTERS, sm_threads: int = SM_THREADS,
                            sm_max_blocks: int = SM_MAX_BLOCKS) -> int:
    """Blocks of `threads` threads one SM holds at once, given the kernel's registers per thread and static
    shared memory per block (the CUDA occupancy calculator: registers are allocated per warp in 256s)."""
    warps = math.ceil(threads / 32)
    regs_per_warp = math.ceil(max(registers, 1) * 32 / REGISTER_ALLOC_UNIT) * REGISTER_ALLOC_UNIT
    by_registers = sm_registers // (regs_per_warp * warps)
    by_shared = sm_shared_bytes // shared_bytes if shared_bytes else sm_max_blocks
    return max(1, min(by_registers, by_shared, sm_threads // threads, sm_max_blocks))


def copy_word_bytes(row_bytes: int, *data_pointers: int) -> int:
    """16-byte words when every row and pointer is 16-byte aligned, else 2-byte words (all KV dtypes are even)."""
    if row_bytes % 16 == 0 and all(p % 16 == 0 for p in data_pointers):
        return 16
    return 2


def copy_chunks(words: int) -> int:
    """CUDA blocks along one row / KV block in the copy kernels (grid y)."""
    return max(1, min(MAX_GRID_YZ, math.ceil(words / COPY_WORDS_PER_BLOCK)))


def vector_bytes(head_dim: int, itemsize: int) -> int:
    """Width of the attention kernel's K/V loads (kv_common.cuh RowVec): the widest of 16/8/4 bytes dividing a
    row, at most 8 elements of a 2- or 4-byte type (fp8: up to 16 codes)."""
    row_bytes = head_dim * itemsize
    max_bytes = 16 if itemsize == 1 else min(8 * itemsize, 16)
    return next((b for b in (16, 8, 4) if row_bytes % b == 0 and b <= max_bytes), itemsize)


def check_pool_alignment(head_dim: int, itemsize: int, **pool_pointers: int) -> None:
    """Raise ValueError unless every pool starts on the attention kernel's vector boundary."""
    needed = vector_bytes(head_dim, itemsize)
    for name, pointer in pool_pointers.items():
        if pointer % needed:
            raise ValueError(f"{name}: data must start on a {needed}-byte boundary for vector loads ({pointer:#x})")
