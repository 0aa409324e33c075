"""`python -m workbench.paper.fit_block_costs`: the per-block costs of the `vllm-sosp23-a100` profile.

Two least-squares fits to the vLLM paper's microbenchmarks (Kwon et al., SOSP 2023; points read from
the plots at about ±2 ms / ±3 µs, docs/clock-profiles.md):

- Fig. 19a, swapping 256 tokens of OPT-13B out and back in at block sizes 1-256 (the artifact's
  benchmark_swap.py, sosp-ae-39/sosp-ae-astra: one cudaMemcpyAsync per block for each layer's key
  and value cache): time = bytes / host_link + copies × swap_s_per_transfer.
- Fig. 18a, the attention kernel of vLLM (block size 16) against FasterTransformer's contiguous one
  at batch 8 and 32, context 64-256 (OPT-13B, 40 heads): the difference = a fixed cost per kernel
  launch + attn_s_per_block × block visits (one per block, query head and sequence). The profile
  takes the slope; the launch cost is part of the fitted step overhead.
"""

from __future__ import annotations

import argparse

import numpy as np

from workbench.presets import MODELS

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SWAP_TOKENS = 256  # benchmark_swap.py: 256 // block_size blocks moved
# Fig. 19a "Swap in + out" (ms) at BLOCK_SIZES
SWAP_IN_OUT_MS = (137.4, 89.3, 60.9, 47.4, 40.1, 36.8, 35.0, 33.9, 33.5)
KERNEL_BLOCK_SIZE = 16  # vLLM's default, the block size of Fig. 18a
# Fig. 18a: (batch, context length, vLLM µs, FasterTransformer µs)
KERNEL_US = ((8, 64, 31.5, 22.2), (8, 128, 43.7, 35.1), (8, 256, 84.5, 62.3),
             (32, 64, 76.6, 61.6), (32, 128, 126.8, 106.7), (32, 256, 235.0, 194.1))


def fit_swap() -> tuple[float, float, np.ndarray]:
    """(host link GB/s, seconds per copy, residuals in ms) of the Fig. 19a swap in + out."""
    model = MODELS["opt-13b"]
    swap_bytes = SWAP_TOKENS * model.kv_bytes_per_token("fp16")
    copies = np.array([2 * (SWAP_TOKENS // b) * 2 * model.num_layers for b in BLOCK_SIZES], float)  # out and in
    design = np.c_[np.full(len(BLOCK_SIZES), 2.0 * swap_bytes), copies]  # [points, (1 / bytes per s, s per copy)]
    measured_s = np.array(SWAP_IN_OUT_MS) * 1e-3
    (s_per_byte, s_per_copy), *_ = np.linalg.lstsq(design, measured_s, rcond=None)
    return 1e-9 / s_per_byte, s_per_copy, (design @ (s_per_byte, s_per_copy) - measured_s) * 1e3


def fit_kernel() -> tuple[float, float, np.ndarray]:
    """(seconds per launch, seconds per block visit, residuals in µs) of the Fig. 18a difference."""
    heads = MODELS["opt-13b"].num_heads
    visits = np.array([batch * (ctx // KERNEL_BLOCK_SIZE) * heads for batch, ctx, _, _ in KERNEL_US], float)
    extra_s = np.array([paged - contiguous for _, _, paged, contiguous in KERNEL_US]) * 1e-6
    design = np.c_[np.ones_like(visits), visits]
    coef, *_ = np.linalg.lstsq(design, extra_s, rcond=None)
    return coef[0], coef[1], (design @ coef - extra_s) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.paper.fit_block_costs",
                                     description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    link_gbps, s_per_copy, swap_res = fit_swap()
    print(f"Fig. 19a: host_link_gbps {link_gbps:.1f}  swap_s_per_transfer {s_per_copy * 1e6:.2f} us  "
          f"residuals (ms) {np.round(swap_res, 1).tolist()}")
    launch_s, s_per_visit, kernel_res = fit_kernel()
    print(f"Fig. 18a: attn_s_per_block {s_per_visit * 1e9:.2f} ns  (per launch {launch_s * 1e6:.1f} us)  "
          f"residuals (us) {np.round(kernel_res, 1).tolist()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
