"""Attention-kernel cost per attended KV token, from what a sweep wrote.

Run level (summary): the kernel reads each attended token's K and V rows once,
`2 × kernel_heads × head_dim × dtype_bytes` bytes, at the run's measured `kernel_gbps` (decode and
prefill attention together); one GB/s is one byte per ns.

Decode only (steps.parquet of a `clock: measured` run): the lower quartile over the steps that ran the
kernel with no prefill of `kernel_time_s / token_slots` — every live token's KV is attended once by a
decode step when nothing is shared. Interference (a first call's JIT load, other processes on the
cores) only ever adds wall time, and on a shared machine it can touch half the steps, so a low
quantile estimates the undisturbed cost while still averaging over the batches the run produced.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from workbench.presets import dtype_bytes, model_from_name
from workbench.sweep.layout import POINTS_DIR

DECODE_QUANTILE = 25  # percentile of the per-step times


def ns_per_context_token(rows: pd.DataFrame) -> np.ndarray:
    """float [num_rows]: run-level kernel time per attended token (ns) of each row's kernel layer."""
    out = []
    for row in rows.itertuples(index=False):
        model = model_from_name(row.model)
        heads = model.num_kv_heads if pd.isna(row.kernel_heads) else int(row.kernel_heads)
        token_bytes = 2 * heads * model.head_dim * dtype_bytes(row.kv_dtype)
        out.append(token_bytes / row.kernel_gbps if row.kernel_gbps > 0 else np.nan)
    return np.array(out, dtype=float)


def decode_ns_per_token(sweep_dir: Path, point_id: str) -> float:
    """Decode-kernel time per attended token (ns) of one point (lower quartile over its decode-only
    kernel steps); NaN when no step qualifies."""
    steps = pd.read_parquet(Path(sweep_dir) / POINTS_DIR / point_id / "steps.parquet",
                            columns=["kernel_time_s", "num_prefill_tokens", "num_decode_tokens", "token_slots"])
    decode = steps[(steps["kernel_time_s"] > 0) & (steps["num_prefill_tokens"] == 0) & (steps["num_decode_tokens"] > 0)]
    if decode.empty:
        return float("nan")
    per_token_s = decode["kernel_time_s"].to_numpy() / decode["token_slots"].to_numpy()  # [num_decode_steps]
    return float(np.percentile(per_token_s, DECODE_QUANTILE)) * 1e9
