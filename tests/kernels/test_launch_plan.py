"""Launch plans shared by the CuPy and CPU-shim backends: rows per block, row chunks, split-K, vector widths."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.kernels import launch, source


@given(
    spans=st.lists(st.integers(1, 200_000), min_size=1, max_size=64),
    num_kv_heads=st.integers(1, 16),
    group=st.integers(1, 64),
    max_q=st.integers(1, 4096),
    num_sms=st.integers(1, 160),
)
def test_plan_covers_every_row_and_position(spans, num_kv_heads, group, max_q, num_sms):
    max_q = min(max_q, min(spans))
    plan = launch.plan_attention(group * num_kv_heads, num_kv_heads, max_q, spans, num_sms)
    num_rows = max_q * group
    assert plan.rows in (1, 2, 4, 8)
    assert plan.rows == min(8, 1 << math.ceil(math.log2(num_rows)))  # smallest tile holding the group
    assert (plan.row_chunks - 1) * plan.rows < num_rows <= plan.row_chunks * plan.rows
    # every KV position of the longest span is in exactly one partition, and no partition is empty
    max_span = max(spans)
    assert (plan.num_partitions - 1) * plan.partition_tokens < max_span <= plan.num_partitions * plan.partition_tokens
    slots = launch.DEFAULT_BLOCKS_PER_SM * num_sms
    blocks_per_seq = num_kv_heads * plan.row_chunks
    time = lambda tokens: launch.modeled_time_tokens(blocks_per_seq, np.array(spans), tokens, slots)
    assert time(plan.partition_tokens) <= time(max_span), "a split never models slower than none"
    if plan.num_partitions > 1:
        assert plan.partition_tokens >= launch.MIN_PARTITION_TOKENS
        assert plan.partition_tokens % launch.PARTITION_ALIGN_TOKENS == 0
        assert plan.num_partitions <= launch.MAX_SPLITS
    assert plan.grid(num_kv_heads, len(spans)) == (num_kv_heads * plan.row_chunks, plan.num_partitions, len(spans))


def test_small_batch_long_context_splits_into_one_full_wave():
    """Four sequences, 8 kv heads, 32k context on 132 SMs x 3 blocks: 12 pieces make 384 blocks, one wave;
    13 would spill a second wave."""
    plan = launch.plan_attention(32, 8, 1, [32768] * 4, 132, blocks_per_sm=3)
    assert plan.rows == 4 and plan.row_chunks == 1
    assert plan.num_partitions == 12 and plan.partition_tokens == 2752  # ceil(32768 / 12) rounded up to 64
    assert 4 * 8 * plan.num_partitions <= 3 * 132


def test_one_long_sequence_among_short_ones_is_split_though_the_grid_is_full():
    """63 sequences of 512 and one of 32k: 512 blocks unsplit are more than the 396 resident, yet the long
    one's blocks would run alone for 32k positions; cut into pieces, every wave is short."""
    spans = [512] * 63 + [32768]
    plan = launch.plan_attention(32, 8, 1, spans, 132, blocks_per_sm=3)
    assert plan.num_partitions > 1
    unsplit = launch.modeled_time_tokens(8, np.array(spans), 32768, 396)
    assert launch.modeled_time_tokens(8, np.array(spans), plan.partition_tokens, 396) < unsplit / 8


def test_split_k_leaves_no_runt_partition():
    """1000 tokens over 3 pieces: equal 384-token pieces and a 232-token last one, not 320 x 3 + a 40-token runt."""
    plan = launch.plan_attention(8, 8, 1, [1000], 1, blocks_per_sm=24)
    assert (plan.num_partitions, plan.partition_tokens) == (3, 384)


@pytest.mark.parametrize(
    "registers, shared_bytes, expected",
    [(160, 8192, 3), (128, 8192, 4), (64, 8192, 8), (32, 8192, 16), (255, 8192, 2), (64, 100_000, 2)],
)
def test_occupancy_from_registers_and_shared_memory(registers, shared_bytes, expected):
    """sm_90 limits: 65536 registers (256 per warp granule), 228 KiB shared memory, 2048 threads per SM."""
    assert launch.occupancy_blocks_per_sm(registers, shared_bytes, 228 * 1024) == expected


def test_a_batch_that_fills_whole_waves_is_not_split():
    """48 sequences x 8 kv heads = 384 blocks: one wave of 396; halving each would take two waves of half."""
    plan = launch.plan_attention(32, 8, 1, [4096] * 48, 132, blocks_per_sm=3)
    assert plan.num_partitions == 1 and plan.partition_tokens == 4096


def test_a_large_batch_is_split_only_to_even_out_its_last_wave():
    """256 x 8 = 2048 blocks are 5.2 waves of 396, the sixth mostly idle (86% of the slots busy); smaller
    pieces keep nearly every slot of every wave busy."""
    plan = launch.plan_attention(32, 8, 1, [4096] * 256, 132, blocks_per_sm=3)
    blocks = 256 * 8 * plan.num_partitions
    assert plan.num_partitions > 1 and blocks / (math.ceil(blocks / 396) * 396) >= 0.95


def test_forced_partitions_and_bad_values():
    assert launch.plan_attention(4, 1, 1, [1000, 3], 1, partition_tokens=7).num_partitions == 143
    with pytest.raises(ValueError, match="partition_tokens"):
        launch.plan_attention(4, 1, 1, [1000, 3], 1, partition_tokens=0)
    with pytest.raises(ValueError, match="grid too large"):
        launch.plan_attention(4, 1, 1, [10] * 70_000, 1)


@pytest.mark.parametrize(
    "head_dim, itemsize, expected",
    [(64, 4, 16), (80, 4, 16), (80, 2, 16), (96, 2, 16), (256, 2, 16), (6, 2, 4), (3, 4, 4), (3, 2, 2), (2, 4, 8),
     (128, 1, 16), (80, 1, 16), (6, 1, 1)],  # fp8: up to 16 codes per vector
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
