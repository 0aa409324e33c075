"""`python -m workbench.paper.fit_operators`: fit the clock's operator constants to Vidur's profiled kernels.

Fitted on one GPU and model, Vidur's A100 (80 GB) Llama-2-7B layers (`workbench.paper.vidur`), under the
roofline profile's default efficiencies (eff_bw 0.8, eff_flops 0.75):

1. `KERNEL_LAUNCH_S` and `ELEMENTWISE_BW_FRAC`: a layer's element-wise kernels (two norms, rope, the
   activation, two residual adds) take 6 × launch + bytes / (bandwidth × frac), linear in (launch, 1 / frac);
   least squares over every profiled row count, each weighted by 1 / its time (relative residuals).
2. `GEMM_SHAPE_POINTS`: at each anchor row count, the fraction of eff_flops at which the layer's four
   projections take the profiled time (bisection; each projection is its own max(memory, compute) plus a
   launch). Where they are memory bound at any fraction, the smallest fraction that keeps them so. Then
   made non-decreasing from the left: a GEMM with more rows is not given a lower efficiency.

Prints the constants as `workbench/clock/roofline.py` should hold them (rounded), the fitted pair's
residuals and the other pairs' (H100 Llama-2-7B, A100 Llama-3-8B), which are predictions.
"""

from __future__ import annotations

import argparse

import numpy as np

from workbench.paper import vidur

ANCHORS = (64, 128, 256, 512, 2048, 4096)


def fit_rows():
    data = vidur.profiled()
    gpu, model = vidur.FIT_ON
    return data[(data["gpu"] == gpu) & (data["model"] == model)].set_index("num_tokens").sort_index()


def fit_elementwise() -> tuple[float, float]:
    """(kernel launch s, element-wise bandwidth fraction)."""
    rows = fit_rows()
    clock = vidur.clock_for(*vidur.FIT_ON)
    ops = vidur.group_operators(clock, "elementwise")
    kernels = sum(op.kernels for op in ops) / clock.forward.layers
    a, b = [], []
    for tokens, row in rows.iterrows():
        # at frac 1 and no launch cost, the kernels' time is their bytes over the bandwidth
        stream_s = sum(vidur.layer_op_s(clock, op, int(tokens), kernel_launch_s=0.0, elementwise_bw_frac=1.0)
                       for op in ops)
        measured_s = vidur.profiled_layer_ms(row)["elementwise"] * 1e-3
        a.append([kernels / measured_s, stream_s / measured_s])
        b.append(1.0)
    (launch_s, inv_frac), *_ = np.linalg.lstsq(np.array(a), np.array(b), rcond=None)
    return float(launch_s), float(1.0 / inv_frac)


def fit_gemm_shape(launch_s: float) -> list[tuple[int, float]]:
    """(anchor rows, fraction of eff_flops), non-decreasing."""
    rows = fit_rows()
    clock = vidur.clock_for(*vidur.FIT_ON)
    ops = vidur.group_operators(clock, "linear")
    peak = clock.flops_per_s  # eff_flops × peak

    def linear_s(tokens: int, frac: float) -> float:
        return sum(vidur.layer_op_s(clock, op, tokens, peak * frac, kernel_launch_s=launch_s) for op in ops)

    points = []
    for tokens in ANCHORS:
        measured_s = vidur.profiled_layer_ms(rows.loc[tokens])["linear"] * 1e-3
        lo, hi = 1e-3, 1.0 / vidur.EFF_FLOPS  # at most the dense peak
        floor_s = linear_s(tokens, 1e9)  # memory bound
        target_s = max(measured_s, floor_s)
        for _ in range(60):
            mid = (lo + hi) / 2
            # memory-bound ties: take the smallest fraction that reaches the floor
            if linear_s(tokens, mid) > target_s * (1 + 1e-12):
                lo = mid
            else:
                hi = mid
        points.append((tokens, hi))
    out, best = [], 0.0
    for tokens, frac in points:
        best = max(best, frac)
        out.append((tokens, best))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.paper.fit_operators",
                                     description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    launch_s, frac = fit_elementwise()
    shape = fit_gemm_shape(launch_s)
    print(f"KERNEL_LAUNCH_S = {launch_s * 1e6:.1f}e-6  (fit {launch_s * 1e6:.3f} µs)")
    print(f"ELEMENTWISE_BW_FRAC = {frac:.2f}  (fit {frac:.4f})")
    print("GEMM_SHAPE_POINTS = (" + ", ".join(f"({t}, {f:.2f})" for t, f in shape) + ")")
    print("\nthe clock (with the constants it holds now) against Vidur's profile, ms per layer less attention:")
    table = vidur.comparison()
    table = table.pivot_table(index=["gpu", "model", "num_tokens", "fitted"], columns="group",
                              values=["vidur_ms", "clock_ms"]).round(4)
    print(table.to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
