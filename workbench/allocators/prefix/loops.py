"""The per-step hashing of `prefix.chains` as one compiled pass over the decode batch.

Same arithmetic as `prefix.keys` (uint64, wrapping): a token's term is mix(token ^ salt[offset]),
a block's key is parent_key * B + mix(sum of its terms). Every operand is uint64, so Numba never
promotes to float.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from workbench.splitmix import mix


@njit(cache=True)
def token_term(token, salt):
    """The hash term of `token` (any integer) at the block offset whose position salt is `salt` (uint64): the
    one statement of it. A block's content hash is `mix` of the (wrapping) sum of its tokens' terms: distinct
    (offset, token) pairs get independent strong hashes, so the sum is equal only for equal blocks."""
    return mix(np.uint64(token) ^ salt)


@njit(cache=True)
def next_key(parent, term_sum, base):
    """The chain key of a block whose predecessor is keyed `parent` (0: none) and whose tokens' terms sum to
    `term_sum`, all uint64: the one statement of it (`keys.chain_keys` unrolls it over a run of blocks)."""
    return parent * base + mix(term_sum)


@njit(cache=True)
def token_terms_into(token_ids, offsets, salt, terms):
    """Writes into `terms` (uint64 [n]) the terms of `token_ids` at block offsets `offsets` (int [n] each)."""
    for i in range(token_ids.shape[0]):
        terms[i] = token_term(token_ids[i], salt[offsets[i]])


@njit(cache=True)
def append_terms(rows, lengths, token_ids, salt, base, chain_key, tail_sum, known, filled_rows, filled_parents,
                 filled_keys):
    """Mutates `chain_key`, `tail_sum` [capacity_rows] and the outputs. Each row of `rows` (int64
    [num_seqs]) just wrote `token_ids[i]` at position lengths[row] - 1; add its term to the row's
    partial block, and when that fills the block, chain the block's key. Writes the rows whose block
    became full and whose tokens are all `known` (bool [capacity_rows]), their blocks' parent keys and
    keys into `filled_rows`, `filled_parents`, `filled_keys` ([num_seqs] each); returns how many."""
    block_size = salt.shape[0]
    num_filled = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        offset = (lengths[r] - 1) % block_size
        term_sum = tail_sum[r] + token_term(token_ids[i], salt[offset])
        if offset == block_size - 1:
            parent = chain_key[r]
            key = next_key(parent, term_sum, base)
            chain_key[r] = key
            tail_sum[r] = np.uint64(0)
            if known[r]:
                filled_rows[num_filled] = r
                filled_parents[num_filled] = parent
                filled_keys[num_filled] = key
                num_filled += 1
        else:
            tail_sum[r] = term_sum
    return num_filled


@njit(cache=True)
def prompt_keys(token_ids, salt, base, keys):
    """Writes into `keys` (uint64 [len(token_ids) // block_size]) the chain keys of the full blocks of
    `token_ids` (int32), block by block: key = parent key * B + mix(sum of the block's token terms)."""
    block_size = salt.shape[0]
    key = np.uint64(0)
    for b in range(keys.shape[0]):
        term_sum = np.uint64(0)
        for j in range(block_size):
            term_sum += token_term(token_ids[b * block_size + j], salt[j])
        key = next_key(key, term_sum, base)
        keys[b] = key


@njit(cache=True)
def start_rows(rows, token_ids, salt, last_key, chain_key, tail_sum, known):
    """Mutates `chain_key`, `tail_sum`, `known` [capacity_rows] at `rows` (int64 [n]), which now hold
    `token_ids` (int [t]) whose last full block is keyed `last_key` (uint64; 0: none): the term sum of
    the tokens after that block, the same terms `append_terms` adds one at a time."""
    block_size = salt.shape[0]
    term_sum = np.uint64(0)
    for i in range(token_ids.shape[0] // block_size * block_size, token_ids.shape[0]):
        term_sum += token_term(token_ids[i], salt[i % block_size])
    for r in rows:
        chain_key[r] = last_key
        tail_sum[r] = term_sum
        known[r] = True
