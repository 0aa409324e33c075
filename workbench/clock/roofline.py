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
charges a prompt's KV on the link from its prefill to its decode replica (`link_s`), outside any step: the
fleet's event loop holds the request (and its blocks on the prefill replica) until the transfer ends.

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

import numpy as np

from workbench.clock import step_formula as F
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


# the attributes `RooflineClock._constants` puts in K
FORMULA_CONSTANTS = frozenset((
    "kv_bytes_per_token", "attn_bytes_per_row", "bytes_per_s", "attn_flops_per_key", "attn_s_per_block_read",
    "attention_launch_s", "kernel_launch_s", "block_bytes", "tp", "allreduce_fixed_s", "allreduce_s_per_token",
    "map_s_per_page", "overlap_map", "link_bytes_per_s", "swap_fixed_s_per_block", "step_overhead_s",
    "separate_prefill", "prefill_overhead_s"))


class RooflineClock:
    """Pure function of the step's work; holds the constants of one run."""

    def __init__(self, model: ModelPreset, gpu: GpuPreset, kv_bytes_per_token: int, block_size: int, *,
                 eff_bw: float, eff_flops: float, step_overhead_s: float, separate_prefill: bool = False,
                 map_s_per_page: float = 0.0, overlap_map: bool = False, host_link_gbps: float | None = None,
                 swap_s_per_transfer: float = 0.0, attn_s_per_block: float = 0.0, overlap_load: bool = False,
                 shared_link_gb_s: float = 0.0, tp: int = 1, kernel_launch_s: float = KERNEL_LAUNCH_S,
                 prefill_overhead_s: float | None = None) -> None:
        # separate_prefill: the engine runs prompts and decodes as separate iterations (vLLM 0.1), so
        # a step that has both costs the two in sequence, each with its own weight pass and overhead
        self.separate_prefill = separate_prefill
        self.forward = forward_pass(model, dtype_bytes(model.weight_dtype))
        self.kernel_launch_s = kernel_launch_s
        # attention's launches (its kernel and the KV-cache write, every layer): every step has them
        self.attention_launch_s = self.forward.attention_kernels * kernel_launch_s
        # attention reads each row's query and writes its output, beside the KV rows
        # (the attention layers: a recurrent layer keeps no KV and its own operators are per row, `forward`)
        attn_layers = model.attention_layers
        self.attn_bytes_per_row = 2.0 * attn_layers * model.num_heads * model.head_dim * ACTIVATION_BYTES
        # every GPU holds and reads the whole of a replicated (latent) KV row: the bytes over all GPUs are tp ×
        copies = tp if model.kv_replicated else 1
        self.kv_bytes_per_token = float(kv_bytes_per_token * copies)
        self.block_bytes = float(kv_bytes_per_token * block_size * copies)
        # QK^T and PV: 2 flops per multiply-add each, per query head, layer and key
        self.attn_flops_per_key = 4.0 * attn_layers * model.num_heads * model.head_dim
        if model.kv_layout == "latent":
            self._latent_attention(model)
        # tensor parallelism: tp GPUs, each with its own HBM, SMs and host link, work on their shards at once
        self.tp = tp
        self.bytes_per_s = gpu.hbm_gb_s * 1e9 * eff_bw * tp
        self.flops_per_s = gpu.peak_tflops * 1e12 * eff_flops * tp  # large GEMMs; scaled by gemm_shape_frac
        self.num_layers = model.num_layers  # a draft model's one layer is this share of a step (`draft_s`)
        self._flops_per_s_at: dict[int, float] = {}  # tokens of a step -> its GEMMs' FLOP rate, as computed
        # per row count, NaN until computed: the per-row operators' time, the output layer's time (sampled rows)
        # and the GEMM rate; the formula (workbench.clock.step_formula) reads them, both step loops share them
        self.rows_s_table, self.output_s_table, self.flops_per_s_table = (np.full(1024, np.nan) for _ in range(3))
        self.need = np.zeros(4, dtype=np.int64)  # the table entries a formula lacked
        link_gb_s = gpu.host_link_gb_s * HOST_LINK_EFF if host_link_gbps is None else host_link_gbps
        self.link_bytes_per_s = link_gb_s * 1e9 * tp
        # two all-reduces per layer of every token's activations (the residual stream's width)
        ring_bytes_per_token = 2.0 * (tp - 1) / tp * model.hidden * ACTIVATION_BYTES
        self.allreduce_s_per_token = (2 * model.num_layers * ring_bytes_per_token
                                      / (gpu.gpu_link_gb_s * 1e9 * GPU_LINK_EFF))
        self.allreduce_fixed_s = 2 * model.num_layers * ALLREDUCE_LATENCY_S if tp > 1 else 0.0
        # a swapped block is one host<->device copy per layer for its keys and one for its values
        # (vLLM's swap_blocks issues a cudaMemcpyAsync per block and cache tensor), each with a fixed cost
        self.swap_fixed_s_per_block = 2 * attn_layers * swap_s_per_transfer
        # decode attention visits each KV block once per query head and layer (vLLM 0.1's paged kernel:
        # one thread block per head and sequence, its warps loop over the blocks), each visit with a
        # fixed cost on top of the bytes (block-table load, branches; docs/clock-profiles.md)
        # (under tensor parallelism each GPU visits its own heads' blocks, at the same time as the others)
        self.attn_s_per_block_read = attn_s_per_block * attn_layers * model.num_heads / tp
        # a recurrent model (docs/recurrent.md): each sequence of a step reads and writes its whole state once,
        # and a checkpoint taken or restored is a copy of it (read and write)
        self.state_bytes_per_seq = float(model.state_bytes_per_seq())
        self.step_overhead_s = step_overhead_s
        # a prompt iteration's own overhead under separate_prefill (None: the same as a decode step's)
        self.prefill_overhead_s = step_overhead_s if prefill_overhead_s is None else prefill_overhead_s
        self.map_s_per_page = map_s_per_page
        self.overlap_map = overlap_map
        self.load_s_per_block = self.block_bytes / self.link_bytes_per_s
        # a shared-tier block crosses the shared link (0: no shared tier, nothing is ever loaded from one)
        self.shared_load_s_per_block = self.block_bytes / (shared_link_gb_s * 1e9) if shared_link_gb_s else 0.0
        self.overlap_load = overlap_load
        self.K = self._constants()

    def __setattr__(self, name: str, value) -> None:
        # the attributes are the constants' truth: K follows a change made after construction (a test's or a
        # fit's variant of one clock)
        object.__setattr__(self, name, value)
        if name in FORMULA_CONSTANTS and "K" in self.__dict__:
            object.__setattr__(self, "K", self._constants())

    def _constants(self) -> np.ndarray:
        """The constants the formula reads, in `step_formula`'s K order (`FORMULA_CONSTANTS`)."""
        K = np.zeros(F.NUM_CONSTS)
        K[F.KV_BYTES_PER_TOKEN], K[F.ATTN_BYTES_PER_ROW] = self.kv_bytes_per_token, self.attn_bytes_per_row
        K[F.BYTES_PER_S], K[F.ATTN_FLOPS_PER_KEY] = self.bytes_per_s, self.attn_flops_per_key
        K[F.ATTN_S_PER_BLOCK_READ], K[F.ATTENTION_LAUNCH_S] = self.attn_s_per_block_read, self.attention_launch_s
        K[F.KERNEL_LAUNCH_S], K[F.BLOCK_BYTES], K[F.TP] = self.kernel_launch_s, self.block_bytes, self.tp
        K[F.ALLREDUCE_FIXED_S], K[F.ALLREDUCE_S_PER_TOKEN] = self.allreduce_fixed_s, self.allreduce_s_per_token
        K[F.MAP_S_PER_PAGE], K[F.OVERLAP_MAP] = self.map_s_per_page, self.overlap_map
        K[F.LINK_BYTES_PER_S], K[F.SWAP_FIXED_S_PER_BLOCK] = self.link_bytes_per_s, self.swap_fixed_s_per_block
        K[F.STEP_OVERHEAD_S], K[F.SEPARATE_PREFILL] = self.step_overhead_s, self.separate_prefill
        K[F.PREFILL_OVERHEAD_S] = self.prefill_overhead_s
        return K

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
        """Duration of the step a `workbench.clock.step_cost.StepCost` describes (`step_formula.compute_s`: one
        iteration, or a decode and a prompt iteration under `separate_prefill`). Host-tier and shared-tier loads
        (one after the other) are added to it, or with `overlap_load` hidden behind it up to its length."""
        sampled = cost.sampled_tokens
        if sampled is None:  # a StepCost built by hand: every decode row and one prompt row sample
            sampled = cost.num_decode_tokens + (1 if cost.num_prefill_tokens else 0)
        measured_s = math.nan if measured_attention_s is None else measured_attention_s
        while True:
            step_s = F.compute_s(self.K, self.rows_s_table, self.output_s_table, self.flops_per_s_table, self.need,
                                 cost.num_prefill_tokens, cost.num_decode_tokens, cost.kv_read_tokens,
                                 cost.attn_query_ctx, cost.decode_ctx_tokens, cost.copied_blocks, cost.swapped_blocks,
                                 measured_s, cost.mapped_pages, cost.decode_blocks, sampled)
            if not math.isnan(step_s):
                break
            self.fill(self.need)
        if cost.draft_passes:
            step_s += self.draft_s(cost.draft_passes, cost.draft_rows, cost.draft_ctx_tokens)
        if self.state_bytes_per_seq:
            step_s += self.state_s(cost.num_running, cost.state_copies)
        if not (cost.loaded_blocks or cost.shared_loaded_blocks):
            return step_s
        load_s = cost.loaded_blocks * self.load_s_per_block + cost.shared_loaded_blocks * self.shared_load_s_per_block
        return max(step_s, load_s) if self.overlap_load else step_s + load_s

    def step_s(self, num_tokens: int, kv_read_tokens: float, attn_query_ctx: float, copied_blocks: int,
               swapped_blocks: int, measured_attention_s: float | None = None, mapped_pages: int = 0,
               decode_blocks: int = 0, sampled_tokens: int | None = None) -> float:
        """Duration of one iteration (`step_formula.step_s`), all counts over the full model:
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
        self.rows_s(num_tokens)
        self.output_layer_s(sampled_tokens)
        return F.step_s(self.K, self.rows_s_table, self.output_s_table, self.flops_per_s_table, num_tokens,
                        kv_read_tokens, attn_query_ctx, copied_blocks, swapped_blocks,
                        math.nan if measured_attention_s is None else measured_attention_s, mapped_pages,
                        decode_blocks, sampled_tokens)

    def draft_s(self, passes: int, rows: int, ctx_tokens: int) -> float:
        """A speculative step's draft model (EAGLE's head, DeepSeek's MTP module: one decoder layer of the
        target's geometry sharing its output layer) proposing `passes` tokens one after another for `rows`
        sequences whose contexts total `ctx_tokens` rows. A pass runs one layer's share of the per-row
        operators, the output layer over its rows and reads the draft layer's KV, with one layer's launches."""
        layers = self.num_layers
        one_pass_s = (self.rows_s(rows) / layers + self.output_layer_s(rows)
                      + ctx_tokens * self.kv_bytes_per_token / layers / self.bytes_per_s
                      + self.attention_launch_s / layers)
        return passes * one_pass_s

    def state_s(self, num_seqs: int, copies: int) -> float:
        """HBM time of a recurrent model's states in a step: `num_seqs` sequences each read and write theirs,
        and `copies` checkpoints are taken or restored (a read and a write of a state each)."""
        return 2.0 * (num_seqs + copies) * self.state_bytes_per_seq / self.bytes_per_s

    def fill(self, need) -> None:
        """Mutates the tables: the entries a formula lacked (`need`, step_formula's NEED_* order)."""
        self.rows_s(int(need[F.NEED_ROWS_A]))
        self.rows_s(int(need[F.NEED_ROWS_B]))
        self.output_layer_s(int(need[F.NEED_SAMPLED_A]))
        self.output_layer_s(int(need[F.NEED_SAMPLED_B]))

    def rows_s(self, num_tokens: int) -> float:
        """The per-row operators' time of a step with `num_tokens` rows, as the formula adds it (memoized in
        `rows_s_table`, with the GEMM rate at that row count)."""
        self._hold(num_tokens)
        rows_s = self.rows_s_table[num_tokens]
        if math.isnan(rows_s):
            rows_s = self.rows_s_table[num_tokens] = self._operators_s(self.forward.per_row, num_tokens)
            self.flops_per_s_table[num_tokens] = self.gemm_flops_per_s(num_tokens)
        return float(rows_s)

    def output_layer_s(self, sampled_tokens: int) -> float:
        """The output layer's time for `sampled_tokens` rows, as the formula adds it (0 rows: it does not run;
        memoized in `output_s_table`)."""
        self._hold(sampled_tokens)
        output_s = self.output_s_table[sampled_tokens]
        if math.isnan(output_s):
            output_s = self.output_s_table[sampled_tokens] = (
                self._operators_s((self.forward.output,), sampled_tokens) if sampled_tokens else 0.0)
        return float(output_s)

    def gemm_flops_per_s(self, rows: int) -> float:
        """The FLOP rate of GEMMs with `rows` rows, over the tensor-parallel GPUs (memoized); the formula divides
        a step's attention FLOPs by it."""
        rate = self._flops_per_s_at.get(rows)
        if rate is None:
            rate = self._flops_per_s_at[rows] = self.flops_per_s * gemm_shape_frac(rows)
        return rate

    def _hold(self, rows: int) -> None:
        """Mutates. The tables reach index `rows` (doubling; new entries NaN: not computed)."""
        size = self.rows_s_table.shape[0]
        if rows < size:
            return
        while size <= rows:
            size *= 2
        for name in ("rows_s_table", "output_s_table", "flops_per_s_table"):
            old = getattr(self, name)
            new = np.full(size, np.nan)
            new[:old.shape[0]] = old
            setattr(self, name, new)

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
