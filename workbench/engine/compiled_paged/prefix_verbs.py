"""The pool verbs of a hash-chain prefix cache in the compiled step loop (workbench.engine.compiled_paged).

Each is the strategy's one-call verb, over the arrays `CompiledPrefixPool.views` lends (the tuple `X`, in
that order, then the workload's segments and the loop's scratch buffers; `step_loop` builds nothing of it):
  count_prompt   `PagedStrategy._count_admission`'s keys and hits (`PrefixCacheStrategy._lookup`)
  place          `PrefixCacheStrategy._place_admission`'s one call (`prefix.admit_one_call.place_prompt`)
  append         `PrefixCacheStrategy.append_if_room`'s one call (`prefix.decode_append.append_evicting`)
  release        `PrefixCacheStrategy._release`'s one call (`prefix.take_release.release_to_cache`)
The token ids they hash are the general loop's (`prompts.fill_tokens`, `segment_token`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from workbench.allocators.prefix import admit_one_call, decode_append, key_table, lru_list, take_release
from workbench.allocators.prefix.keys import CHAIN_BASE
from workbench.allocators.prefix.loops import prompt_keys
from workbench.engine.compiled_paged import prompts
from workbench.workload.request import segment_token

# called only from the compiled loop: no wrapper for Python callers is built (less to compile)
_inner = njit(cache=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)

# X: the index's arrays (CompiledPrefixPool.views), the workload's segments (prompts.PromptSegments), scratch
(SLOT_KEY, SLOT_BLOCK, NEXT_COPY, REGISTERED, KEY_OF, PREV, NXT, QUEUED, LAST_USE, ENDS, SALT, CHAIN_KEY, TAIL_SUM,
 KNOWN, SEG_START, SEG_KEY, SEG_LEN, OUTPUT_KEY,
 TOKENS, KEYS, HITS, BATCH_TOKENS, PREFILL_CACHED, RELEASED_SCRATCH) = range(24)


@_inner
def cached_blocks(ends):
    """Blocks held only as cache (evictable): the LRU order's length (`ends`: X[ENDS])."""
    return ends[lru_list.LENGTH]


@_inner
def has_room(slot_key, num_keys, more):
    """Whether the key table (`slot_key`: X[SLOT_KEY]) takes `more` keys beyond its `num_keys` without growing
    (`one_call_view`)."""
    return 2 * (num_keys + more) <= slot_key.shape[0]


@_inner
def count_prompt(X, i, tokens, prompt, block_size, refcount):
    """Request i's first `tokens` token ids (into X[TOKENS]), the chain keys of their full blocks (X[KEYS]) and
    the registered blocks a hit reuses (X[HITS]): a hit leaves the last token to compute. Returns (full blocks,
    hits, hits sitting in the cache)."""
    token_ids = X[TOKENS][:tokens]
    prompts.fill_tokens(X[SEG_START], X[SEG_KEY], X[SEG_LEN], X[OUTPUT_KEY], i, prompt, tokens, token_ids)
    num_full = tokens // block_size
    keys = X[KEYS][:num_full]
    prompt_keys(token_ids, X[SALT], CHAIN_BASE, keys)
    num_hit = key_table.lookup(X[SLOT_KEY], X[SLOT_BLOCK], keys, (tokens - 1) // block_size, X[HITS])
    revived = 0
    for j in range(num_hit):
        if refcount[X[HITS][j]] == 0:
            revived += 1
    return num_full, num_hit, revived


@_inner
def place(X, row, num_full, num_hit, need, tokens, final, refcount, free_ids, free_size, table, length, final_len,
          num_blocks, last_block):
    """`row` (new, empty) holds what `count_prompt` counted last, with `need` fresh blocks. Returns (blocks
    from the free stack, keys the table gained less those it lost)."""
    rows = np.full(1, row, dtype=np.int64)
    fresh = np.empty(need, dtype=np.int32)
    return admit_one_call.place_prompt(
        rows, X[HITS][:num_hit], fresh, X[KEYS], num_full, tokens, final, X[TOKENS], refcount, free_ids, free_size,
        table, length, final_len, num_blocks, last_block, X[PREV], X[NXT], X[QUEUED], X[LAST_USE], X[ENDS],
        X[SLOT_KEY], X[SLOT_BLOCK], X[NEXT_COPY], X[REGISTERED], X[KEY_OF], X[SALT], X[CHAIN_KEY], X[TAIL_SUM],
        X[KNOWN])


@_inner
def append(X, rows, row_req, prompt, length, final_len, num_blocks, swapped, last_block, table, refcount, block_size,
           scratch, mark, free_ids, free_size, slots, copies):
    """The decode batch `rows` appends each sequence's next generated token. Returns `append_evicting`'s
    (status, x, from free, evicted, copies, slots copied, tables grown, keys gained less lost)."""
    n = rows.shape[0]
    token_ids, output_key = X[BATCH_TOKENS][:n], X[OUTPUT_KEY]
    for k in range(n):  # the token each writes: its generated token at its position past the prompt
        i = row_req[rows[k]]
        token_ids[k] = segment_token(output_key[i], np.uint64(length[rows[k]] - np.int64(prompt[i])))
    return decode_append.append_evicting(
        rows, token_ids, length, final_len, num_blocks, swapped, last_block, table, refcount, block_size, scratch,
        mark, free_ids, free_size, X[PREV], X[NXT], X[QUEUED], X[LAST_USE], X[ENDS], X[SLOT_KEY], X[SLOT_BLOCK],
        X[NEXT_COPY], X[REGISTERED], X[KEY_OF], X[SALT], CHAIN_BASE, X[CHAIN_KEY], X[TAIL_SUM], X[KNOWN], slots,
        copies)


@_inner
def release(X, released, free_ids, free_size):
    """A sequence's `released` blocks (head first) join the cache or the free stack. Returns the stack's size."""
    return take_release.release_to_cache(released, X[REGISTERED], X[PREV], X[NXT], X[QUEUED], X[LAST_USE], X[ENDS],
                                         free_ids, free_size, X[RELEASED_SCRATCH])
