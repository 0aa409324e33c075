"""Keys of a sequence's full blocks: a hash chain over (parent key, block token ids), vectorized.

key[i] identifies the whole prefix of blocks 0..i, so equal keys mean equal prefixes (up to 64-bit
collisions, probability ~2^-64 per pair) and a block is reused only under an identical prefix.
The chain is key[i] = key[i-1] * B + c[i] (mod 2^64), key[-1] = 0, over strong per-block content
hashes c[i] = mix(sum of the block's token terms). A prompt is hashed in one compiled pass over its
tokens (`prefix.loops.prompt_keys`). A chunk that continues a known key uses the chain's linearity: it
unrolls into one prefix sum, key[i] = B^(i+1) * parent + B^i * sum_{j<=i} c[j] * B^-j, a few numpy passes
(`chain_keys`). A block filled token by token during decode gets the same key from its running term sum
(`token_terms`; compiled per decode step in `prefix.loops`).
Pure functions of the token ids: identical across processes and runs (no salted Python hash).
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.prefix.loops import prompt_keys, token_terms_into
from workbench.splitmix import mix64

_BASE = 0x9E3779B97F4A7C15 | 1  # odd, so it is invertible mod 2^64
_BASE_INV = pow(_BASE, -1, 2**64)
CHAIN_BASE = np.uint64(_BASE)
_powers = np.ones(1, dtype=np.uint64)  # B^i, grown on demand; uint64 array arithmetic wraps mod 2^64
_powers_inv = np.ones(1, dtype=np.uint64)  # B^-i
_salts: dict[int, np.ndarray] = {}


def _power_tables(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(B^i, B^-i) for i < n, uint64 [n] each (views of tables that grow by doubling)."""
    global _powers, _powers_inv
    if _powers.shape[0] < n:
        size = max(n, 2 * _powers.shape[0])
        _powers = np.cumprod(np.full(size, _BASE, dtype=np.uint64), dtype=np.uint64) * np.uint64(_BASE_INV)
        _powers_inv = np.cumprod(np.full(size, _BASE_INV, dtype=np.uint64), dtype=np.uint64) * np.uint64(_BASE)
    return _powers[:n], _powers_inv[:n]


def position_salt(block_size: int) -> np.ndarray:
    """A strong hash of each position inside a block, uint64 [block_size]."""
    salt = _salts.get(block_size)
    if salt is None:
        salt = _salts[block_size] = mix64(np.arange(block_size, dtype=np.uint64))
    return salt


def token_terms(token_ids: np.ndarray, offsets: np.ndarray, block_size: int) -> np.ndarray:
    """Hash terms of tokens at these offsets inside their blocks, uint64 [n] for int [n] each
    (`loops.token_term`)."""
    terms = np.empty(token_ids.shape[0], dtype=np.uint64)
    token_terms_into(token_ids, offsets, position_salt(block_size), terms)
    return terms


def block_keys(token_ids: np.ndarray, block_size: int) -> np.ndarray:
    """Chain keys of the full blocks of `token_ids` (int32 [n]), uint64 [n // block_size]: one compiled pass
    (`loops.prompt_keys`), the same keys as `chain_keys` of the blocks' term sums."""
    keys = np.empty(token_ids.shape[0] // block_size, dtype=np.uint64)
    prompt_keys(np.ascontiguousarray(token_ids, dtype=np.int32), position_salt(block_size), CHAIN_BASE, keys)
    return keys


def chain_keys(parent_key: np.uint64, term_sums: np.ndarray) -> np.ndarray:
    """Chain keys of consecutive blocks whose token-term sums are `term_sums` (uint64 [n]), following
    the block keyed `parent_key` (0: none), uint64 [n]; `block_keys` gives the same keys from tokens."""
    n = term_sums.shape[0]
    powers, powers_inv = _power_tables(n + 1)
    return powers[1:] * parent_key + powers[:n] * np.cumsum(mix64(term_sums) * powers_inv[:n], dtype=np.uint64)

