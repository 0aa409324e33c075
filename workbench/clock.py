"""Step-duration models (docs/engine.md): how long one engine iteration takes on the modeled GPU.

`roofline`: max(bytes / (bw × eff_bw), flops / (peak × eff_flops)) + step_overhead, with
bytes = weights once + KV read by attention + KV written + copy-on-write and swap traffic, and
flops = 2 × params × tokens + attention flops. `measured`: the attention part is the real kernel's
wall time for one layer, scaled to the full model, and the rest is modeled as above.
"""

from __future__ import annotations

from workbench.presets import GpuPreset, ModelPreset

# Host<->device link for swaps: PCIe 4.0 x16 moves ~25 GB/s in practice (32 GB/s theoretical).
HOST_LINK_GB_S = 25.0


class RooflineClock:
    """Pure function of the step's work; holds the constants of one run."""

    def __init__(self, model: ModelPreset, gpu: GpuPreset, kv_bytes_per_token: int, block_size: int, *,
                 eff_bw: float, eff_flops: float, step_overhead_s: float) -> None:
        self.weight_bytes = float(model.weight_bytes())
        self.params = model.params_b * 1e9
        self.kv_bytes_per_token = float(kv_bytes_per_token)
        self.block_bytes = float(kv_bytes_per_token * block_size)
        # QK^T and PV: 2 flops per multiply-add each, per query head, layer and key
        self.attn_flops_per_key = 4.0 * model.num_layers * model.num_heads * model.head_dim
        self.bytes_per_s = gpu.hbm_gb_s * 1e9 * eff_bw
        self.flops_per_s = gpu.peak_tflops * 1e12 * eff_flops
        self.link_bytes_per_s = HOST_LINK_GB_S * 1e9
        self.step_overhead_s = step_overhead_s

    def step_s(self, num_tokens: int, kv_read_tokens: int, attn_query_ctx: int, copied_blocks: int,
               swapped_blocks: int, measured_attention_s: float | None = None) -> float:
        """Duration of a step, all counts over the full model:
        `num_tokens` through the linear layers (prefill + decode); `kv_read_tokens` KV rows read by
        attention, summed over sequences; `attn_query_ctx` keys attended, summed over query tokens;
        `copied_blocks` copy-on-write copies; `swapped_blocks` moved over the host link.
        With `measured_attention_s` (full-model attention wall time) the attention terms are replaced
        by the measurement and the rest stays modeled."""
        written = num_tokens * self.kv_bytes_per_token + 2.0 * copied_blocks * self.block_bytes
        linear_flops = 2.0 * self.params * num_tokens
        if measured_attention_s is None:
            compute_s = max((self.weight_bytes + written + kv_read_tokens * self.kv_bytes_per_token)
                            / self.bytes_per_s,
                            (linear_flops + attn_query_ctx * self.attn_flops_per_key) / self.flops_per_s)
        else:
            compute_s = max((self.weight_bytes + written) / self.bytes_per_s,
                            linear_flops / self.flops_per_s) + measured_attention_s
        swap_s = swapped_blocks * self.block_bytes / self.link_bytes_per_s
        return compute_s + swap_s + self.step_overhead_s
