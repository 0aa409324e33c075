"""Exact values of the summary, the roofline clock and the K/V content functions."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench import columns as C
from workbench.clock.roofline import (
    ELEMENTWISE_BW_FRAC,
    HOST_LINK_EFF,
    KERNEL_LAUNCH_S,
    RooflineClock,
    gemm_shape_frac,
)
from workbench.engine import kvpool
from workbench.engine.kvpool import KVContent, content_terms, prefix_sums, to_storage
from workbench.kernels import reference
from workbench.presets import GPUS, MODELS
from workbench.results import FLOAT_STEP_COLUMNS, INT_STEP_COLUMNS, StepLog, summarize
from workbench.splitmix import mix64
from workbench.workload.request import output_key, segment_token_ids, token_ids_for

EXTRA = {"prefix_query_tokens": 100, "prefix_hit_tokens": 25, "prefix_evicted_blocks": 3, "kernel_backend": "none",
         "kernel_time_s": 0.0, "kernel_gbps": 0.0, "verify_max_rel_err": math.nan, "sim_wall_s": 0.1}


def _steps(rows: list[dict]) -> pd.DataFrame:
    log = StepLog()
    log.rows_per_chunk = 1  # every row its own chunk: the table is put together from chunks
    for r in rows:
        full = {c: 0 for c in C.STEP_COLUMNS} | r
        log.record(tuple(full[c] for c in FLOAT_STEP_COLUMNS), tuple(full[c] for c in INT_STEP_COLUMNS))
    return log.to_frame()


def _requests() -> pd.DataFrame:
    return pd.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 1.0], "admitted_s": [0.0, 1.0],
                         "first_token_s": [0.5, 2.0], "finish_s": [2.5, 4.0], "prompt_tokens": [3, 3],
                         "output_tokens": [5, 1], "prefix_hit_tokens": [0, 25], "num_preemptions": [0, 1],
                         "status": ["finished", "finished"]})


def test_summary_weights_by_step_duration_and_splits_saturated_steps():
    steps = _steps([
        dict(step=0, t_s=1.0, dt_s=1.0, num_waiting=0, num_running=2, token_slots=60, free_slots=40,
             logical_token_slots=80, largest_free_extent_slots=40, unshared_block_slots=80, block_table_bytes=8),
        dict(step=1, t_s=4.0, dt_s=3.0, num_waiting=2, num_running=4, token_slots=20, reserved_slots=30,
             external_frag_slots=10, free_slots=40, logical_token_slots=20, largest_free_extent_slots=20,
             unshared_block_slots=50, block_table_bytes=16, preemptions=1, cow_copies=2),
    ])
    s = summarize(steps, _requests(), capacity_slots=100, generated_tokens=6, extra=EXTRA)
    assert tuple(s) == C.SUMMARY_KEYS
    assert s["mem_token_frac"] == pytest.approx((60 * 1 + 20 * 3) / 4 / 100)
    assert s["mem_reserved_frac"] == pytest.approx(30 * 3 / 4 / 100)
    assert s["mem_free_frac"] == pytest.approx(40 / 100)
    assert s["mem_token_frac_sat"] == pytest.approx(0.2)
    assert s["mem_external_frag_frac_sat"] == pytest.approx(0.1)
    assert s["ext_frag_index"] == pytest.approx((0 + (1 - 20 / 50)) / 2)
    assert s["sharing_saving_frac"] == pytest.approx(1 - (60 + 60) / (80 + 60))
    assert s["block_sharing_saving_frac"] == pytest.approx(1 - (60 + 150) / (80 + 150))
    assert s["prefix_hit_rate"] == 0.25
    assert s["block_table_bytes_mean"] == pytest.approx((8 + 48) / 4)
    assert s["mean_batch_size"] == 3 and s["max_batch_size"] == 4
    assert s["saturated_step_frac"] == 0.5 and s["mean_batch_size_sat"] == 4
    assert s["throughput_tok_s_sat"] == pytest.approx(4 / 3.0)  # one token per running sequence and step
    assert s["throughput_req_s"] == 0.5 and s["throughput_tok_s"] == 1.5
    assert s["normalized_latency_s_per_tok"] == pytest.approx((2.5 / 5 + 3.0 / 1) / 2)
    assert s["ttft_p50_s"] == pytest.approx(0.75)
    assert s["tpot_p50_s"] == pytest.approx(2.0 / 4)  # only multi-token outputs have a TPOT
    assert (s["num_preemptions"], s["cow_copies"], s["num_finished"], s["num_rejected"]) == (1, 2, 2, 0)


def test_roofline_step_by_hand_for_opt_13b():
    """OPT-13B (40 layers, hidden 5120, MLP 20480, vocab 50272, tied embedding) on an A100-40GB, every
    operator's bytes written out from the model's shapes: a decode step is memory bound in every operator,
    a 2048-token prefill compute bound in its projections and attention."""
    model, gpu = MODELS["opt-13b"], GPUS["a100-40gb"]
    kv_tok = model.kv_bytes_per_token("fp16")
    clock = RooflineClock(model, gpu, kv_tok, 16, eff_bw=0.8, eff_flops=0.5, step_overhead_s=1e-3)
    layers, h, v = 40, 5120, 50272
    f = (12.85e9 - v * h) / layers / (2 * h) - 2 * h  # the MLP width params_b leaves (4 h^2 in attention)
    assert f == pytest.approx(20480, rel=0.01)
    bw, flops = 1555e9 * 0.8, 312e12 * 0.5
    elementwise_bw = bw * ELEMENTWISE_BW_FRAC
    launches_s = (12 * layers + 3) * KERNEL_LAUNCH_S
    # activations (2 bytes) per row: the projections read and write theirs (qkv 5120 -> 15360, o, up, down)
    gemm_io = layers * (h + 3 * h + h + h + h + f + f + h) * 2
    # norms (2 per layer and 1 final) read and write a row, rope q and k, residual adds read 2 write 1,
    # the activation reads and writes the MLP's row, the embedding gathers and writes one
    elementwise_io = (layers * (2 * 2 * h + 2 * 2 * h + 2 * 3 * h + 2 * f) + 2 * h + 2 * h) * 2
    output_io = h * 2 + v * 4  # per sampled row: its hidden state in, fp32 logits out
    attn_io = layers * 2 * h * 2  # per row: the query in, the output out
    weights = 12.85e9 * 2  # the tied embedding is the output layer's weight: read once, as every weight

    # decode of 8 sequences with 1000 tokens of context each: every operator memory bound
    decode = clock.step_s(8, 8000, 8000, 0, 0, sampled_tokens=8)
    memory = weights + 8 * (gemm_io + output_io + attn_io) + (8 + 8000) * kv_tok
    assert decode == pytest.approx(memory / bw + 8 * elementwise_io / elementwise_bw + launches_s + 1e-3, rel=1e-9)
    # a 2048-token prefill sampling one token: the projections and attention at the GEMM rate of 2048 rows,
    # the one-row output layer bound by reading its weights
    rows = 2048
    rate = flops * gemm_shape_frac(rows)
    attn_flops = 4 * 40 * 40 * 128 * (rows * (rows + 1) // 2)
    body_flops = 2 * (12.85e9 - v * h) * rows
    output_s = max((v * h * 2 + output_io) / bw, 2 * v * h / (flops * gemm_shape_frac(1)))
    prefill = clock.step_s(rows, rows, rows * (rows + 1) // 2, 0, 0, sampled_tokens=1)
    expected = (body_flops + attn_flops) / rate + output_s + rows * elementwise_io / elementwise_bw + launches_s
    assert prefill == pytest.approx(expected + 1e-3, rel=1e-9)
    # swapping 10 blocks adds their transfer over the host link
    assert clock.step_s(8, 8000, 8000, 0, 10) - clock.step_s(8, 8000, 8000, 0, 0) == pytest.approx(
        10 * 16 * kv_tok / (25.0e9))
    assert gpu.host_link_gb_s * HOST_LINK_EFF == 25.0  # PCIe 4.0 x16 as copies achieve it
    # a measured attention time replaces the attention operator; the KV write stays
    measured = clock.step_s(8, 8000, 8000, 0, 0, measured_attention_s=0.5, sampled_tokens=8)
    modeled_attention_s = (8 * attn_io + (8 + 8000) * kv_tok) / bw
    assert measured == pytest.approx(decode - modeled_attention_s + 8 * kv_tok / bw + 0.5, rel=1e-9)


def test_page_mapping_adds_to_the_step_or_hides_behind_its_compute():
    model, gpu = MODELS["opt-13b"], GPUS["a100-40gb"]
    kv_tok = model.kv_bytes_per_token("fp16")
    serial = RooflineClock(model, gpu, kv_tok, 1, eff_bw=0.8, eff_flops=0.5, step_overhead_s=1e-3,
                           map_s_per_page=2e-3)
    overlapped = RooflineClock(model, gpu, kv_tok, 1, eff_bw=0.8, eff_flops=0.5, step_overhead_s=1e-3,
                               map_s_per_page=2e-3, overlap_map=True)
    decode = serial.step_s(8, 8000, 8000, 0, 0)  # ~22 ms of weight and KV reads
    assert decode == overlapped.step_s(8, 8000, 8000, 0, 0)
    assert serial.step_s(8, 8000, 8000, 0, 0, mapped_pages=3) == pytest.approx(decode + 6e-3)
    assert overlapped.step_s(8, 8000, 8000, 0, 0, mapped_pages=3) == decode  # hidden behind the compute
    assert overlapped.step_s(8, 8000, 8000, 0, 0, mapped_pages=20) == pytest.approx(40e-3 + 1e-3)


def _rows_of(tokens: np.ndarray, content: KVContent):
    return content.rows(prefix_sums(content_terms(tokens, np.arange(len(tokens)))))


@pytest.mark.parametrize("kv_dtype", ["fp32", "fp16", "bf16", "fp8"])
def test_kv_rows_are_the_table_sums_their_hash_bits_pick(kv_dtype):
    """The compiled content rows, bit for bit, against the formula in array operations: per head, splitmix64
    of the prefix hash xor the head's salt; K = table0[bits 0-11] + table1[bits 12-23], V from tables 2 and 3
    by bits 24-35 and 36-47."""
    content = KVContent(num_kv_heads=3, head_dim=8, kv_dtype=kv_dtype)
    hashes = np.random.default_rng(7).integers(0, 2**63, 50, dtype=np.uint64) * np.uint64(3)  # high bits too
    with np.errstate(over="ignore"):
        bits = mix64(hashes[:, None] ^ (np.arange(3, dtype=np.uint64)[None, :] * kvpool._HEAD_MUL))  # [T, H]
    pick = [((bits >> np.uint64(12 * i)) & np.uint64(4095)).astype(np.intp) for i in range(4)]
    t = content.tables
    want_k, want_v = t[0][pick[0]] + t[1][pick[1]], t[2][pick[2]] + t[3][pick[3]]
    k, v = content.model_rows(hashes)
    model_dtype = kvpool.MODEL_DTYPES[kv_dtype]
    for got, want in ((k, want_k), (v, want_v)):
        want = to_storage(want, model_dtype)
        assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8))
    assert content.model_rows(hashes[:0])[0].shape == (0, 3, 8)


@given(st.lists(st.integers(0, 50_000), min_size=2, max_size=40), st.integers(1, 39))
def test_kv_rows_depend_on_the_whole_prefix_and_nothing_else(tokens, cut):
    content = KVContent(num_kv_heads=2, head_dim=8, kv_dtype="fp32")
    tokens = np.array(tokens, dtype=np.int32)
    cut = min(cut, len(tokens) - 1)
    k, v = _rows_of(tokens, content)
    k_prefix, v_prefix = _rows_of(tokens[:cut], content)
    assert np.array_equal(k[:cut], k_prefix) and np.array_equal(v[:cut], v_prefix)  # shared prefix, same KV
    changed = tokens.copy()
    changed[cut - 1] = (changed[cut - 1] + 1) % 50_000
    k2, _ = _rows_of(changed, content)
    assert np.array_equal(k2[: cut - 1], k[: cut - 1])
    assert not np.array_equal(k2[cut - 1:], k[cut - 1:])  # every later row differs
    assert np.abs(k).max() <= 1.0


def test_incremental_decode_hash_equals_the_prefix_recomputation():
    prompt = np.arange(10, dtype=np.int32) * 7
    key = output_key(3, 1)
    generated = token_ids_for(key, 0, 5)
    full = prefix_sums(content_terms(np.concatenate([prompt, generated]), np.arange(15)))
    acc = prefix_sums(content_terms(prompt, np.arange(10)))[-1]
    for j in range(5):
        tok = segment_token_ids(np.array([key], dtype=np.uint64), np.array([j]))
        assert tok[0] == generated[j]
        with np.errstate(over="ignore"):
            acc = acc + content_terms(tok, np.array([10 + j]))[0]
        assert acc == full[10 + j]


def test_bf16_storage_rounds_to_nearest_even():
    x = np.array([1.0, -2.5, 1 + 2**-8, 1 + 3 * 2**-8, 3.14159], dtype=np.float32)
    back = reference.dequantize(to_storage(x, "bf16"), "bf16")
    assert back[:2].tolist() == [1.0, -2.5]
    assert back[2] == 1.0  # halfway: ties to even (mantissa 0)
    assert back[3] == 1 + 4 * 2**-8  # halfway: ties to even (mantissa 2)
    assert abs(back[4] - 3.14159) <= 2**-7 * 2


def test_step_rows_come_back_whole_across_chunks_and_a_ragged_row_is_refused():
    """Rows buffer as flat machine arrays: each comes back in its own columns, whichever chunk held it."""
    log = StepLog()
    log.rows_per_chunk = 3  # 7 rows: chunks of 3, 3 and 1
    rows = [(tuple(float(10 * i + j) + 0.5 for j in range(len(FLOAT_STEP_COLUMNS))),
             tuple(100 * i + j for j in range(len(INT_STEP_COLUMNS)))) for i in range(7)]
    for floats, ints in rows:
        log.record(floats, ints)
    table = log.to_frame()
    assert table[list(FLOAT_STEP_COLUMNS)].to_numpy().tolist() == [list(f) for f, _ in rows]
    assert table[list(INT_STEP_COLUMNS)].to_numpy().tolist() == [list(i) for _, i in rows]
    assert table[list(INT_STEP_COLUMNS)].dtypes.eq("int64").all()
    with pytest.raises(ValueError, match="integer columns"):
        StepLog().record(rows[0][0], rows[0][1][:-1])
    with pytest.raises(TypeError):
        StepLog().record(rows[0][0], (0.5,) + rows[0][1][1:])  # a float where an integer belongs
