"""Launch plans shared by the CuPy and CPU-shim backends: rows per block, row chunks, split-K, vector widths."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.kernels import launch, source


@given(
    num_seqs=st.integers(1, 512),
    num_kv_heads=st.integers(1, 16),
    group=st.integers(1, 64),
    max_q=st.integers(1, 4096),
    max_kv_len=st.integers(1, 200_000),
    num_sms=st.integers(1, 160),
)
def test_plan_covers_every_row_and_position(num_seqs, num_kv_heads, group, max_q, max_kv_len, num_sms):
    max_q = min(max_q, max_kv_len)
    plan = launch.plan_attention(num_seqs, group * num_kv_heads, num_kv_heads, max_q, max_kv_len, num_sms)
    num_rows = max_q * group
    assert plan.rows in (1, 2, 4, 8)
    assert plan.rows == min(8, 1 << math.ceil(math.log2(num_rows)))  # smallest tile holding the group
    assert (plan.row_chunks - 1) * plan.rows < num_rows <= plan.row_chunks * plan.rows
    # every KV position of the longest sequence is in exactly one partition, and no partition is empty
    assert (plan.num_partitions - 1) * plan.partition_tokens < max_kv_len <= plan.num_partitions * plan.partition_tokens
    base_blocks = num_seqs * num_kv_heads * plan.row_chunks
    target = launch.DEFAULT_BLOCKS_PER_SM * num_sms
    if plan.num_partitions > 1:
        assert base_blocks < target, "split-K only when the unsplit grid leaves SMs idle"
        assert plan.partition_tokens >= launch.MIN_PARTITION_TOKENS
        assert plan.partition_tokens % launch.PARTITION_ALIGN_TOKENS == 0
        assert plan.num_partitions <= math.ceil(target / base_blocks), "no more pieces than the device needs"
        if plan.partition_tokens > launch.MIN_PARTITION_TOKENS:  # equal pieces: the last is no runt
            last = max_kv_len - (plan.num_partitions - 1) * plan.partition_tokens
            assert last > plan.partition_tokens - launch.PARTITION_ALIGN_TOKENS * plan.num_partitions
    assert plan.grid(num_kv_heads, num_seqs) == (num_kv_heads * plan.row_chunks, plan.num_partitions, num_seqs)


def test_small_batch_long_context_splits_to_fill_the_device():
    """Four sequences, 8 kv heads, 32k context on 132 SMs: the unsplit grid would be 32 blocks."""
    plan = launch.plan_attention(4, 32, 8, 1, 32768, 132, blocks_per_sm=3)
    assert plan.rows == 4 and plan.row_chunks == 1
    assert plan.num_partitions == 13 and plan.partition_tokens == 2560  # ceil(396 / 32) pieces of ceil(32768 / 13)
    assert 3 * 132 <= 4 * 8 * plan.num_partitions < 2 * 3 * 132


def test_split_k_leaves_no_runt_partition():
    """1000 tokens over 3 pieces: equal 384-token pieces and a 232-token last one, not 320 x 3 + a 40-token runt."""
    plan = launch.plan_attention(1, 8, 8, 1, 1000, 1, blocks_per_sm=24)
    assert (plan.num_partitions, plan.partition_tokens) == (3, 384)


@pytest.mark.parametrize(
    "registers, shared_bytes, expected",
    [(160, 8192, 3), (128, 8192, 4), (64, 8192, 8), (32, 8192, 16), (255, 8192, 2), (64, 100_000, 2)],
)
def test_occupancy_from_registers_and_shared_memory(registers, shared_bytes, expected):
    """sm_90 limits: 65536 registers (256 per warp granule), 228 KiB shared memory, 2048 threads per SM."""
    assert launch.occupancy_blocks_per_sm(registers, shared_bytes, 228 * 1024) == expected


def test_large_batch_is_not_split():
    plan = launch.plan_attention(256, 32, 8, 1, 4096, 132)
    assert plan.num_partitions == 1 and plan.partition_tokens == 4096


def test_forced_partitions_and_bad_values():
    assert launch.plan_attention(2, 4, 1, 1, 1000, 1, partition_tokens=7).num_partitions == 143
    with pytest.raises(ValueError, match="partition_tokens"):
        launch.plan_attention(2, 4, 1, 1, 1000, 1, partition_tokens=0)
    with pytest.raises(ValueError, match="grid too large"):
        launch.plan_attention(70_000, 4, 1, 1, 10, 1)


@pytest.mark.parametrize(
    "head_dim, itemsize, expected",
    [(64, 4, 16), (80, 4, 16), (80, 2, 16), (96, 2, 16), (256, 2, 16), (6, 2, 4), (3, 4, 4), (3, 2, 2), (2, 4, 8),
     (128, 1, 8), (80, 1, 8), (6, 1, 1)],  # fp8: at most 8 elements per vector
)
def test_vector_width_is_the_widest_that_divides_a_row(head_dim, itemsize, expected):
    assert launch.vector_bytes(head_dim, itemsize) == expected


def test_pool_alignment_check_names_the_pool():
    launch.check_pool_alignment(64, 2, k_pool=0x1000, v_pool=0x2000)
    with pytest.raises(ValueError, match="v_pool: data must start on a 16-byte boundary"):
        launch.check_pool_alignment(64, 2, k_pool=0x1000, v_pool=0x2004)


def test_constants_mirror_the_cuda_source():
    """The launcher's block size and row tiles are the ones attention.cu assumes."""
    text = source.read_source(source.ATTENTION_CU)
    assert re.search(rf"constexpr int ATTN_THREADS = {launch.ATTN_THREADS};", text)
    assert source.ROW_TILES == (1, 2, 4, 8)
