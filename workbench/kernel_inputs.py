"""What a step's plan tells the kernel runner: slot mappings of the admitted sequences, the decode
batch's token ids and positions, and on attention steps the kernels' views of the batch.

Built by the scheduler once a step's allocations are final, so the runner never calls the strategy.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.base import Strategy
from workbench.allocators.hybrid import HybridPaged
from workbench.hybrid_plan import hybrid_kernel_inputs
from workbench.plan import NO_SLOTS, KernelInputs, Prefill, SeqWrite


def kernel_inputs(strategy: Strategy, attention: bool, ids: list[int], decode_seq_ids, positions, token_ids,
                  prefills: list[Prefill], decode_group_slots=None) -> KernelInputs:
    """Pure reads of the strategy. `decode_seq_ids`, `positions`, `token_ids` describe the decode batch
    `ids` (None when it is empty); a hybrid pool's plan gains one input block per layer group."""
    hybrid = isinstance(strategy, HybridPaged)
    writes = []
    for p in prefills:
        g = p.group
        for sample, seq_id in enumerate(g.seq_ids):
            # the first sequence computes the prompt; the others only their own recomputed tokens
            query_start = p.start if sample == 0 else max(p.start, g.request.prompt_tokens)
            slots = (strategy.group_slot_mapping(0, seq_id, p.start, p.stop) if hybrid
                     else strategy.slot_mapping(seq_id, p.start, p.stop))
            writes.append(SeqWrite(seq_id, p.start, p.stop, min(query_start, p.stop), slots))
    decode_desc = extend_desc = None
    if attention and not hybrid:
        if ids:
            decode_desc = strategy.describe(ids)
        extend_ids = [w.seq_id for w in writes if w.query_start < w.stop]
        if extend_ids:
            extend_desc = strategy.describe(extend_ids)
    if decode_seq_ids is None:
        decode_seq_ids, positions, token_ids = NO_SLOTS, NO_SLOTS, np.zeros(0, dtype=np.int32)
    inputs = KernelInputs(tuple(writes), decode_seq_ids, positions, token_ids, attention, decode_desc, extend_desc)
    return hybrid_kernel_inputs(strategy, inputs, ids, decode_group_slots) if hybrid else inputs
