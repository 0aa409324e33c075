"""How a model's recurrent state sits in a paged KV pool (docs/recurrent.md): sizes in the pool's units.

The pool's unit is one token's KV over the attention layers (a slot); a block is `block_size` slots. A
sequence's state over every recurrent layer takes whole blocks from the same pool as its KV, as in vLLM's hybrid
allocator (one pool of equal pages; SGLang instead splits memory into a KV pool and a fixed count of state
slots up front). Two layouts:

- packed (default): the state's bytes take ceil(bytes / block bytes) blocks; the rest of the last block is
  internal fragmentation.
- unified page size (`unify_page_size`, vLLM's hybrid allocator): the attention block size is raised to the
  smallest multiple of the requested one whose page in one attention layer holds one recurrent layer's state,
  and each recurrent layer's state takes one such page: a block (one page in every attention layer) holds the
  states of `attention layers` recurrent layers. A prefix then hits in whole raised blocks.
"""

from __future__ import annotations

from typing import NamedTuple

from workbench.intmath import cdiv
from workbench.presets import GIB, ModelPreset


class StateSizes(NamedTuple):
    blocks_per_state: int  # pool blocks one sequence's state takes
    state_slots: int  # its bytes in slots, rounded up
    cache_blocks: int  # blocks checkpoints may hold (whole states)


def page_bytes_per_token_layer(model: ModelPreset, kv_dtype: str) -> int:
    """One attention layer's KV bytes per token."""
    return model.kv_bytes_per_token(kv_dtype) // model.attention_layers


def unified_block_size(model: ModelPreset, block_size: int, kv_dtype: str) -> int:
    """The attention block size vLLM's hybrid allocator runs `model` at when `block_size` is asked for: the
    smallest multiple of it whose page in one attention layer holds the largest recurrent layer's state."""
    state = max(g.mixer.state_bytes for g in model.state_groups)
    per_block = block_size * page_bytes_per_token_layer(model, kv_dtype)
    return block_size * cdiv(state, per_block)


def state_sizes(model: ModelPreset, kv_dtype: str, block_size: int, capacity_slots: int,
                cache_gib: float | None, unified: bool) -> StateSizes:
    """The state's blocks and slots, and the checkpoint budget: `cache_gib` of memory in whole states (None:
    bounded by the pool alone). Raises ValueError for a budget larger than the pool."""
    slot_bytes = model.kv_bytes_per_token(kv_dtype)
    state_slots = cdiv(model.state_bytes_per_seq(), slot_bytes)
    if unified:
        pages = sum(g.num_layers for g in model.state_groups)
        blocks = cdiv(pages, model.attention_layers)
    else:
        blocks = cdiv(state_slots, block_size)
    pool_blocks = capacity_slots // block_size
    if cache_gib is None:
        budget = pool_blocks
    else:
        pool_gib = pool_blocks * block_size * slot_bytes / GIB
        if cache_gib > pool_gib:
            raise ValueError(f"state_cache_gib ({cache_gib}) exceeds the KV pool ({pool_gib:.4g} GiB): checkpoints "
                             f"live in the pool; lower --state-cache-gib or raise --kv-gib")
        budget = int(cache_gib * GIB // (block_size * slot_bytes))
    return StateSizes(blocks, min(state_slots, blocks * block_size), budget - budget % blocks)
