"""What a step's plan tells the kernel runner: each admitted sequence's rows, the decode batch's token
ids and positions, and per layer group its slots and, on attention steps, the kernels' views of the batch.

Built by the scheduler once a step's allocations are final, so the runner never calls the strategy.
A pool of one layer group (every strategy for a model without sliding-window layers) is the case of
one `GroupKernelInputs`; a hybrid pool's groups each get their own (docs/hybrid.md).
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.base import Strategy
from workbench.allocators.values import AppendResult
from workbench.engine.plan import NO_SLOTS, GroupKernelInputs, KernelInputs, Landed, Prefill, SeqWrite, Verify

_NO_TOKENS = np.zeros(0, dtype=np.int32)


def kernel_inputs(strategy: Strategy, attention: bool, ids: list[int], decode_seq_ids, positions, token_ids,
                  prefills: list[Prefill], appended: AppendResult | None, landed: list[Landed] = (),
                  verify: Verify | None = None) -> KernelInputs:
    """Pure reads of the strategy. `decode_seq_ids`, `positions`, `token_ids` describe the decode batch
    `ids` (None when it is empty), `appended` is the step's decode append (None when nothing decodes);
    `landed` sequences have their shipped rows written, with no query. With `verify` (speculative decoding)
    the decode batch is a verify step: each sequence writes its last token's and its drafts' rows and queries
    all of them over its KV, as a prefill chunk does (the drafts' rows hold the tokens the target accepts:
    draft token ids are not modeled)."""
    writes = []
    if verify is not None:
        writes += [SeqWrite(s, c - 1, c + d, c - 1)
                   for s, c, d in zip(verify.ids, verify.ctx.tolist(), verify.drafts.tolist(), strict=True)]
        ids, decode_seq_ids, appended = [], None, None
    for p in prefills:
        for sample, seq_id in enumerate(p.seq_ids):
            # the first sequence computes the prompt; the others only their own recomputed tokens
            query_start = p.start if sample == 0 else max(p.start, p.prompt_tokens)
            writes.append(SeqWrite(seq_id, p.start, p.stop, min(query_start, p.stop)))
    writes += [SeqWrite(t.seq_id, t.cached_tokens, t.kv_len, t.kv_len) for t in landed]
    extend_ids = [w.seq_id for w in writes if w.query_start < w.stop]
    groups = []
    for gi, layers in enumerate(strategy.layer_groups):
        decode_desc = extend_desc = None
        if attention:
            decode_desc = strategy.describe_group(gi, ids) if ids else None
            extend_desc = strategy.describe_group(gi, extend_ids) if extend_ids else None
        groups.append(GroupKernelInputs(
            window_tokens=layers.window_tokens, layer_frac=layers.layer_frac,
            write_slots=tuple(strategy.group_slot_mapping(gi, w.seq_id, w.start, w.stop) for w in writes),
            decode_slots=NO_SLOTS if appended is None else appended.slots_of_group(gi),
            decode_desc=decode_desc, extend_desc=extend_desc))
    if decode_seq_ids is None:
        decode_seq_ids, positions, token_ids = NO_SLOTS, NO_SLOTS, _NO_TOKENS
    return KernelInputs(tuple(writes), decode_seq_ids, positions, token_ids, attention, tuple(groups))
