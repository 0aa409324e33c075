"""Attention-kernel cost per context token, derived from a run's summary: the decode kernel reads
each attended token's K and V rows once, `2 × kernel_heads × head_dim × dtype_bytes` bytes, at
the run's measured `kernel_gbps`; one GB/s is one byte per ns."""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.presets import dtype_bytes, model_from_name


def ns_per_context_token(rows: pd.DataFrame) -> np.ndarray:
    """float [num_rows]: kernel time per attended token (ns) of each row's kernel layer."""
    out = []
    for row in rows.itertuples(index=False):
        model = model_from_name(row.model)
        heads = model.num_kv_heads if pd.isna(row.kernel_heads) else int(row.kernel_heads)
        token_bytes = 2 * heads * model.head_dim * dtype_bytes(row.kv_dtype)
        out.append(token_bytes / row.kernel_gbps)
    return np.array(out, dtype=float)
