"""KV memory one decoding request holds in each layer group of a hybrid model, by context length, measured
on the per-group allocator itself (`allocators.hybrid`, docs/hybrid.md): the left half of figure `hybrid`
and notebook 05."""

from __future__ import annotations

import numpy as np
import pandas as pd

from workbench.allocators import registry
from workbench.allocators.values import SeqSpec
from workbench.presets import MODELS, dtype_bytes


def memory_per_request(name: str, contexts: list[int], *, hybrid: bool, block_size: int = 16,
                       kv_dtype: str = "bf16") -> pd.DataFrame:
    """GiB of KV one request holds in each layer group once it decodes at each context length: a prompt
    of context − 1 tokens admitted on a fresh pool, then one decode step (a window group releases what
    that step's query cannot read). One row per context: model, hybrid, context, a column per group
    ("<layers> layers, full" or "..., window W") and their total."""
    m = MODELS[name]
    unit = m.unit_layers(hybrid)
    layer_groups = m.groups(hybrid)
    groups = tuple((g.window_tokens, g.num_layers // unit) for g in layer_groups)
    slot_bytes = 2 * unit * m.num_kv_heads * m.head_dim * dtype_bytes(kv_dtype)  # K and V of `unit` layers
    labels = [f"{g.num_layers} layers, " + ("full" if g.window_tokens is None else f"window {g.window_tokens}")
              for g in layer_groups]
    rows = []
    for context in contexts:
        blocks = (context // block_size + 2) * sum(units for _, units in groups)
        pool = registry.create_hybrid("paged", capacity_slots=blocks * block_size, block_size=block_size,
                                      max_model_len=context, groups=groups)
        pool.admit([0], SeqSpec(np.zeros(context - 1, dtype=np.int32), context))
        pool.append([0])
        held = {label: g.held_slots * slot_bytes / 2**30 for label, g in zip(labels, pool.group_snapshots(),
                                                                               strict=True)}
        rows.append({"model": name, "hybrid": "on" if hybrid else "off", "context": context, **held,
                     "total": sum(held.values())})
    return pd.DataFrame(rows)
