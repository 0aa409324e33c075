"""Step-duration models (docs/engine.md): how long one engine iteration takes on the modeled GPU.

`roofline`: the forward pass's operators (`workbench.clock.operators`: projections, element-wise kernels,
the output layer for the sampled rows) and attention, each its own max(bytes / (bw × eff_bw), flops /
(peak × eff_flops × gemm_shape_frac(rows))) plus its launches, summed; + per-block attention cost +
copy-on-write copies + swap time + step_overhead. Attention reads the KV of every sequence and writes the
new rows (a sliding-window layer reads and attends min(context, W) keys: `step_cost` averages the
attention totals over layers); a swap = bytes over the host link + a fixed cost per copy. `measured`: the
attention operator is the real kernel's wall time for one layer, scaled to the full model, and the rest
is modeled as above.
The constants come from a clock profile (workbench.clock.profiles, docs/clock-profiles.md); the
per-block attention cost and the per-copy swap cost are zero except where a profile measured them.

A prefix cache's host tier loads its promoted blocks over the same host link as swaps:
after the compute, or with `--overlap-load` only where the load outlasts it (docs/engine.md). A fleet's
shared tier loads its hits over its own link (`--shared-link-gb-s`), charged the same way; a step that
loads from both tiers moves the two one after the other (docs/fleet.md). Disaggregated prefill/decode
charges a prompt's KV on its prefill replica's link (`link_s`), outside any step: the fleet's event loop
holds the request until the transfer ends.

Tensor parallelism (`--tp N`) splits every weight matrix and every KV block's heads over N GPUs: each
reads 1/N of the weights and of the KV and does 1/N of the projections' and attention's FLOPs at its own
bandwidth and peak, while the norms, residual adds and the embedding gather run whole on every GPU and
every GPU launches every kernel; each layer adds two all-reduces of the step's activations (after
attention and after the MLP) over the GPUs' link, on the critical path as in Megatron-LM's layout: a
ring all-reduce moves 2 (N − 1) / N of the bytes per GPU, plus a fixed latency per call.

Strategies that map physical pages on demand (virtual-contiguous) add the mapping calls of the step's
new pages: after the compute, or, with the mapping overlapped (vAttention's background thread maps
ahead while the GPU computes), only where it outlasts the compute.
"""

from __future__ import annotations

import bisect
import math

from workbench.clock.operators import ACTIVATION_BYTES, forward_pass
from workbench.presets import GpuPreset, ModelPreset, dtype_bytes

# Host<->device copies (swaps, host-tier loads) reach about 25 of PCIe 4.0 x16's 32 GB/s per direction
# with pinned memory; the same fraction of the GPU preset's datasheet link (`host_link_gb_s`) is used
# unless a clock profile measured the link itself.
HOST_LINK_EFF = 25.0 / 32.0

# NCCL's ring all-reduce between NVLink-connected GPUs reaches about 3/4 of the link's one-way rate as
# bus bandwidth on large messages and costs about 10 µs per call on small ones (nccl-tests
# all_reduce_perf on 8-GPU A100 and H100 servers: ~230 and ~360 GB/s bus bandwidth).
GPU_LINK_EFF = 0.75
ALLREDUCE_LATENCY_S = 10e-6

# Constants fitted to Vidur's profiled A100 (80 GB) Llama-2-7B layers (Agrawal et al., MLSys 2024) by
# `python -m workbench.paper.fit_operators` under the default eff_bw 0.8 and eff_flops 0.75
# (docs/clock-profiles.md; the H100 and Llama-3-8B profiles are left as predictions):
# - every kernel costs KERNEL_LAUNCH_S on top of its bytes and FLOPs, however little it touches (a one-row
#   norm or residual add still takes microseconds: launch, one wave, drain);
# - element-wise kernels (norms, rope, activation, residual adds, the embedding gather) stream at
#   ELEMENTWISE_BW_FRAC of the bandwidth that weight-streaming GEMMs reach;
# - a GEMM with few rows (the step's tokens) under-fills the GPU: its output tiles do not cover the SMs in
#   whole waves (tile and wave quantization, NVIDIA's "Matrix Multiplication Background User's Guide",
#   ch. 3). GEMM_SHAPE_POINTS: (rows, fraction of eff_flops), linear in log2(rows) between the points and
#   flat outside.
KERNEL_LAUNCH_S = 3.6e-6
ELEMENTWISE_BW_FRAC = 0.73
GEMM_SHAPE_POINTS = ((64, 0.42), (128, 0.66), (256, 0.91), (512, 0.94), (2048, 0.94), (4096, 0.95))
_SHAPE_LOG2 = [math.log2(t) for t, _ in GEMM_SHAPE_POINTS]


def gemm_shape_frac(tokens: int) -> float:
    """Fraction of the large-GEMM FLOP efficiency a step with `tokens` rows reaches."""
    if tokens <= GEMM_SHAPE_POINTS[0][0]:
        return GEMM_SHAPE_POINTS[0][1]
    if tokens >= GEMM_SHAPE_POINTS[-1][0]:
        return GEMM_SHAPE_POINTS[-1][1]
    x = math.log2(tokens)
    i = bisect.bisect_right(_SHAPE_LOG2, x)
    x0, x1 = _SHAPE_LOG2[i - 1], _SHAPE_LOG2[i]
    y0, y1 = GEMM_SHAPE_POINTS[i - 1][1], GEMM_SHAPE_POINTS[i][1]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def link_s(num_bytes: int, link_gb_s: float) -> float:
    """Seconds `num_bytes` take over a link of `link_gb_s` GB/s (10^9 bytes/s) at its full rate: a
    disaggregated prefill replica's KV transfer to a decode replica (docs/fleet.md)."""
    return num_bytes / (link_gb_s * 1e9)


class RooflineClock:
    """Pure function of the step's work; holds the constants of one run."""

    def __init__(self, model: ModelPreset, gpu: GpuPreset, kv_bytes_per_token: int, block_size: int, *,
                 eff_bw: float, eff_flops: float, step_overhead_s: float, separate_prefill: bool = False,
                 map_s_per_page: float = 0.0, overlap_map: bool = False, host_link_gbps: float | None = None,
                 swap_s_per_transfer: float = 0.0, attn_s_per_block: float = 0.0, overlap_load: bool = False,
                 shared_link_gb_s: float = 0.0, tp: int = 1, kernel_launch_s: float = KERNEL_LAUNCH_S) -> None:
        # separate_prefill: the engine runs prompts and decodes as separate iterations (vLLM 0.1), so
        # a step that has both costs the two in sequence, each with its own weight pass and overhead
        self.separate_prefill = separate_prefill
        self.forward = forward_pass(model, dtype_bytes(model.weight_dtype))
        self.kernel_launch_s = kernel_launch_s
        # attention's launches (its kernel and the KV-cache write, every layer): every step has them
        self.attention_launch_s = self.forward.attention_kernels * kernel_launch_s
        # attention reads each row's query and writes its output, beside the KV rows
        self.attn_bytes_per_row = 2.0 * model.num_layers * model.num_heads * model.head_dim * ACTIVATION_BYTES
        # every GPU holds and reads the whole of a replicated (latent) KV row: the bytes over all GPUs are tp ×
        copies = tp if model.kv_replicated else 1
        self.kv_bytes_per_token = float(kv_bytes_per_token * copies)
        self.block_bytes = float(kv_bytes_per_token * block_size * copies)
        # QK^T and PV: 2 flops per multiply-add each, per query head, layer and key
        self.attn_flops_per_key = 4.0 * model.num_layers * model.num_heads * model.head_dim
        if model.kv_layout == "latent":
            self._latent_attention(model)
        # tensor parallelism: tp GPUs, each with its own HBM, SMs and host link, work on their shards at once
        self.tp = tp
        self.bytes_per_s = gpu.hbm_gb_s * 1e9 * eff_bw * tp
        self.flops_per_s = gpu.peak_tflops * 1e12 * eff_flops * tp  # large GEMMs; scaled by gemm_shape_frac
        self._flops_per_s_at: dict[int, float] = {}  # tokens of a step -> its GEMMs' FLOP rate, as computed
        self._rows_s: dict[int, float] = {}  # tokens of a step -> its per-row operators' time, as computed
        self._output_s: dict[int, float] = {}  # sampled rows -> the output layer's time, as computed
        link_gb_s = gpu.host_link_gb_s * HOST_LINK_EFF if host_link_gbps is None else host_link_gbps
        self.link_bytes_per_s = link_gb_s * 1e9 * tp
        # two all-reduces per layer of every token's activations (the residual stream's width)
        ring_bytes_per_token = 2.0 * (tp - 1) / tp * model.hidden * ACTIVATION_BYTES
        self.allreduce_s_per_token = (2 * model.num_layers * ring_bytes_per_token
                                      / (gpu.gpu_link_gb_s * 1e9 * GPU_LINK_EFF))
        self.allreduce_fixed_s = 2 * model.num_layers * ALLREDUCE_LATENCY_S if tp > 1 else 0.0
        # a swapped block is one host<->device copy per layer for its keys and one for its values
        # (vLLM's swap_blocks issues a cudaMemcpyAsync per block and cache tensor), each with a fixed cost
        self.swap_fixed_s_per_block = 2 * model.num_layers * swap_s_per_transfer
        # decode attention visits each KV block once per query head and layer (vLLM 0.1's paged kernel:
        # one thread block per head and sequence, its warps loop over the blocks), each visit with a
        # fixed cost on top of the bytes (block-table load, branches; docs/clock-profiles.md)
        # (under tensor parallelism each GPU visits its own heads' blocks, at the same time as the others)
        self.attn_s_per_block_read = attn_s_per_block * model.num_layers * model.num_heads / tp
        self.step_overhead_s = step_overhead_s
        self.map_s_per_page = map_s_per_page
        self.overlap_map = overlap_map
        self.load_s_per_block = self.block_bytes / self.link_bytes_per_s
        # a shared-tier block crosses the shared link (0: no shared tier, nothing is ever loaded from one)
        self.shared_load_s_per_block = self.block_bytes / (shared_link_gb_s * 1e9) if shared_link_gb_s else 0.0
        self.overlap_load = overlap_load

    def _latent_attention(self, model: ModelPreset) -> None:
        """Attention's constants for a latent KV (MLA in its absorbed form, as FlashMLA decodes): per head the
        query is a kv_lora_rank latent plus a qk_rope_head_dim rotary part, scored against each key's latent
        and rotary key, and the output stays a kv_lora_rank latent. With an indexer (DeepSeek Sparse
        Attention) the key-dependent FLOPs are the indexer's scores over every key, charged per key of the
        full context, and attention's over the top-k keys (`ModelPreset.window_layer_fracs` gives the
        step's cost meter the weights of the two)."""
        layers, heads = model.num_layers, model.num_heads
        latent, rope = model.kv_lora_rank, model.qk_rope_head_dim
        self.attn_bytes_per_row = float(layers * heads * (2 * latent + rope) * ACTIVATION_BYTES)
        # q·c and q_rope·k_rope, then p·c: 2 flops per multiply-add
        self.attn_flops_per_key = 2.0 * layers * heads * (2 * latent + rope)

    def cost_s(self, cost, measured_attention_s: float | None = None) -> float:
        """Duration of the step a `workbench.clock.step_cost.StepCost` describes; see `step_s`. Host-tier
        and shared-tier loads (one after the other) are added to it, or with `overlap_load` hidden behind it
        up to its length."""
        step_s = self._compute_cost_s(cost, measured_attention_s)
        if not (cost.loaded_blocks or cost.shared_loaded_blocks):
            return step_s
        load_s = cost.loaded_blocks * self.load_s_per_block + cost.shared_loaded_blocks * self.shared_load_s_per_block
        return max(step_s, load_s) if self.overlap_load else step_s + load_s

    def _compute_cost_s(self, cost, measured_attention_s: float | None) -> float:
        sampled = cost.sampled_tokens
        if sampled is None:  # a StepCost built by hand: every decode row and one prompt row sample
            sampled = cost.num_decode_tokens + (1 if cost.num_prefill_tokens else 0)
        if not (self.separate_prefill and cost.num_prefill_tokens and cost.num_decode_tokens):
            return self.step_s(cost.num_tokens, cost.kv_read_tokens, cost.attn_query_ctx, cost.copied_blocks,
                               cost.swapped_blocks, measured_attention_s, cost.mapped_pages, cost.decode_blocks,
                               sampled)
        ctx = cost.decode_ctx_tokens
        # a measured attention time covers both phases, and page mapping both: charged to the decode iteration
        decode_s = self.step_s(cost.num_decode_tokens, ctx, ctx, cost.copied_blocks, cost.swapped_blocks,
                               measured_attention_s, cost.mapped_pages, cost.decode_blocks, cost.num_decode_tokens)
        prefill_s = self.step_s(cost.num_prefill_tokens, cost.kv_read_tokens - ctx, cost.attn_query_ctx - ctx, 0, 0,
                                None if measured_attention_s is None else 0.0,
                                sampled_tokens=sampled - cost.num_decode_tokens)
        return decode_s + prefill_s

    def step_s(self, num_tokens: int, kv_read_tokens: float, attn_query_ctx: float, copied_blocks: int,
               swapped_blocks: int, measured_attention_s: float | None = None, mapped_pages: int = 0,
               decode_blocks: int = 0, sampled_tokens: int | None = None) -> float:
        """Duration of a step, all counts over the full model:
        `num_tokens` rows through the layers (prefill + decode); `kv_read_tokens` KV rows read by
        attention, summed over sequences; `attn_query_ctx` keys attended, summed over query tokens;
        `copied_blocks` copy-on-write copies; `swapped_blocks` moved over the host link;
        `sampled_tokens` rows through the output layer (None: one, a lone sequence's step).
        With `measured_attention_s` (full-model attention wall time on one device) the attention operator
        is replaced by the measurement (split over the tensor-parallel GPUs) and the rest stays modeled.
        `mapped_pages`: pages mapped on demand; `decode_blocks`: KV blocks the decoding sequences'
        attention reads, summed over sequences."""
        if sampled_tokens is None:
            sampled_tokens = 1 if num_tokens else 0
        compute_s = self.rows_s(num_tokens) + self.output_layer_s(sampled_tokens)
        if measured_attention_s is None:
            kv_bytes = (num_tokens + kv_read_tokens) * self.kv_bytes_per_token + num_tokens * self.attn_bytes_per_row
            compute_s += max(kv_bytes / self.bytes_per_s,
                             attn_query_ctx * self.attn_flops_per_key / self.gemm_flops_per_s(num_tokens))
            compute_s += decode_blocks * self.attn_s_per_block_read  # a measured kernel includes its own
        else:
            compute_s += num_tokens * self.kv_bytes_per_token / self.bytes_per_s + measured_attention_s / self.tp
        compute_s += self.attention_launch_s
        if copied_blocks:  # copy-on-write: one copy kernel reads and writes each block
            compute_s += 2.0 * copied_blocks * self.block_bytes / self.bytes_per_s + self.kernel_launch_s
        if self.tp > 1:
            compute_s += self.allreduce_fixed_s + num_tokens * self.allreduce_s_per_token
        map_s = mapped_pages * self.map_s_per_page
        compute_s = max(compute_s, map_s) if self.overlap_map else compute_s + map_s
        swap_s = (swapped_blocks * self.block_bytes / self.link_bytes_per_s
                  + swapped_blocks * self.swap_fixed_s_per_block)
        return compute_s + swap_s + self.step_overhead_s

    def rows_s(self, num_tokens: int) -> float:
        """The per-row operators' time of a step with `num_tokens` rows, as `step_s` adds it (memoized)."""
        rows_s = self._rows_s.get(num_tokens)
        if rows_s is None:
            rows_s = self._rows_s[num_tokens] = self._operators_s(self.forward.per_row, num_tokens)
        return rows_s

    def output_layer_s(self, sampled_tokens: int) -> float:
        """The output layer's time for `sampled_tokens` rows, as `step_s` adds it (0 rows: it does not run)."""
        output_s = self._output_s.get(sampled_tokens)
        if output_s is None:
            output_s = self._output_s[sampled_tokens] = (
                self._operators_s((self.forward.output,), sampled_tokens) if sampled_tokens else 0.0)
        return output_s

    def gemm_flops_per_s(self, rows: int) -> float:
        """The FLOP rate of GEMMs with `rows` rows, over the tensor-parallel GPUs (memoized); `step_s` divides
        a step's attention FLOPs by it."""
        rate = self._flops_per_s_at.get(rows)
        if rate is None:
            rate = self._flops_per_s_at[rows] = self.flops_per_s * gemm_shape_frac(rows)
        return rate

    def _operators_s(self, operators, rows: int) -> float:
        """The operators' times at `rows` rows, summed (`operator_s`; weights are read even at 0 rows)."""
        flops_per_s = self.gemm_flops_per_s(rows)
        return sum(operator_s(op, rows, self.bytes_per_s, flops_per_s, self.tp, self.kernel_launch_s)
                   for op in operators)


def operator_s(op, rows: int, bytes_per_s: float, flops_per_s: float, tp: int = 1,
               kernel_launch_s: float = KERNEL_LAUNCH_S, elementwise_bw_frac: float = ELEMENTWISE_BW_FRAC) -> float:
    """One operator (`workbench.clock.operators.Operator`) at `rows` rows: its own max(memory time, compute
    time) plus its launches. `bytes_per_s` and `flops_per_s` are the tensor-parallel GPUs' together (the
    GEMM rate at this row count); an element-wise operator streams at `elementwise_bw_frac` of the
    bandwidth, and a replicated one at one GPU's."""
    if not op.gemm:
        bytes_per_s *= elementwise_bw_frac
    if not op.split:
        bytes_per_s /= tp
    memory_s = (op.weight_bytes_at(rows) + op.bytes_per_row * rows) / bytes_per_s
    return max(memory_s, op.flops_per_row * rows / flops_per_s) + op.kernels * kernel_launch_s
