"""A step's kernel inputs for a hybrid pool: each layer group's own slots and tables (docs/hybrid.md).

The scheduler builds `KernelInputs` as for any strategy (the writes' slots from group 0), then this
adds one `GroupKernelInputs` per layer group; the kernel runner writes every group's slots and runs
each group's attention over its own table with its window.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from workbench.allocators.hybrid import HybridPaged
from workbench.plan import NO_SLOTS, GroupKernelInputs, KernelInputs


def hybrid_kernel_inputs(strategy: HybridPaged, kernel: KernelInputs, decode_ids: list[int],
                         decode_group_slots: np.ndarray | None) -> KernelInputs:
    """`kernel` with its `groups` filled; `decode_group_slots` int64 [num_groups, num_decode] from the
    step's append (None when nothing decodes). Pure."""
    total_units = sum(g.units for g in strategy.groups)
    extend_ids = [w.seq_id for w in kernel.writes if w.query_start < w.stop]
    groups = []
    for gi, g in enumerate(strategy.groups):
        write_slots = tuple(strategy.group_slot_mapping(gi, w.seq_id, w.start, w.stop) for w in kernel.writes)
        decode_desc = extend_desc = None
        if kernel.attention:
            decode_desc = strategy.describe_group(gi, decode_ids) if decode_ids else None
            extend_desc = strategy.describe_group(gi, extend_ids) if extend_ids else None
        groups.append(GroupKernelInputs(
            window_tokens=g.window_tokens or 0, layer_frac=g.units / total_units, write_slots=write_slots,
            decode_slots=NO_SLOTS if decode_group_slots is None else decode_group_slots[gi],
            decode_desc=decode_desc, extend_desc=extend_desc))
    return dataclasses.replace(kernel, groups=tuple(groups))
