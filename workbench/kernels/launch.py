"""Launch configurations of the CUDA kernels, shared by the CuPy launcher and the CPU shim backend.

Pure integer arithmetic, so both backends run the same grids and the heuristics are testable on the CPU.
The constants mirror `kernels/attention.cu` and `kernels/cache_ops.cu`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from workbench.kernels.source import ROW_TILES

ATTN_THREADS = 128  # threads per attention block (kernels/attention.cu)
MERGE_THREADS = 64  # threads per merge_partitions block
COPY_THREADS = 128  # threads per write_cache / copy_blocks block
MIN_PARTITION_TOKENS = 256  # split-K never cuts a sequence into pieces shorter than this
PARTITION_ALIGN_TOKENS = 64
# Split-K aims for at least this many attention blocks per SM: a warp keeps only ATTN_UNROLL steps
# of K/V loads in flight, so the bytes in flight per SM (what saturates HBM) come from resident blocks.
BLOCKS_PER_SM = 8
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
    num_seqs: int,
    num_heads: int,
    num_kv_heads: int,
    max_q_per_seq: int,
    max_kv_len: int,
    num_sms: int,
    partition_tokens: int | None = None,
) -> AttentionPlan:
    """Rows per block, row chunks and split-K partitions for one decode (max_q_per_seq = 1) or extend launch.

    A block serves up to 8 rows: the whole GQA group in decode (rounded up to a power of two), and
    several query tokens times the group in extend. Split-K kicks in when the unsplit grid would
    leave SMs idle (fewer than BLOCKS_PER_SM blocks per SM) and sequences are long: partitions are
    sized so the grid fills the device, never shorter than MIN_PARTITION_TOKENS.
    `partition_tokens` overrides the heuristic (tests use it to exercise the merge on small shapes).
    """
    num_rows = max_q_per_seq * (num_heads // num_kv_heads)  # rows of the longest sequence per kv head
    rows = next((r for r in ROW_TILES if r >= num_rows), ROW_TILES[-1])
    row_chunks = math.ceil(num_rows / rows)
    if partition_tokens is None:
        partition_tokens = _split_k_tokens(num_seqs * num_kv_heads * row_chunks, max_kv_len, num_sms)
    if partition_tokens < 1:
        raise ValueError(f"partition_tokens must be >= 1, got {partition_tokens}")
    num_partitions = max(1, math.ceil(max_kv_len / partition_tokens))
    if num_partitions > MAX_GRID_YZ or num_seqs > MAX_GRID_YZ:
        raise ValueError(f"attention grid too large: {num_partitions} partitions x {num_seqs} sequences (max 65535)")
    return AttentionPlan(rows, row_chunks, num_partitions, partition_tokens)


def _split_k_tokens(base_blocks: int, max_kv_len: int, num_sms: int) -> int:
    target_blocks = BLOCKS_PER_SM * num_sms
    if base_blocks >= target_blocks or max_kv_len < 2 * MIN_PARTITION_TOKENS:
        return max(max_kv_len, 1)
    parts = math.ceil(target_blocks / base_blocks)
    tokens = max_kv_len // parts // PARTITION_ALIGN_TOKENS * PARTITION_ALIGN_TOKENS  # rounded down: >= parts pieces
    return max(tokens, MIN_PARTITION_TOKENS)


def copy_word_bytes(row_bytes: int, *data_pointers: int) -> int:
    """16-byte words when every row and pointer is 16-byte aligned, else 2-byte words (all KV dtypes are even)."""
    if row_bytes % 16 == 0 and all(p % 16 == 0 for p in data_pointers):
        return 16
    return 2


def copy_chunks(words: int) -> int:
    """CUDA blocks along one row / KV block in the copy kernels (grid y)."""
    return max(1, min(MAX_GRID_YZ, math.ceil(words / COPY_WORDS_PER_BLOCK)))


def vector_bytes(head_dim: int, itemsize: int) -> int:
    """Width of the attention kernel's K/V loads (kv_common.cuh RowVec): the widest of 16/8/4 bytes dividing a row."""
    row_bytes = head_dim * itemsize
    return next((b for b in (16, 8, 4) if row_bytes % b == 0), itemsize)


def check_pool_alignment(head_dim: int, itemsize: int, **pool_pointers: int) -> None:
    """Raise ValueError unless every pool starts on the attention kernel's vector boundary."""
    needed = vector_bytes(head_dim, itemsize)
    for name, pointer in pool_pointers.items():
        if pointer % needed:
            raise ValueError(f"{name}: data must start on a {needed}-byte boundary for vector loads ({pointer:#x})")
