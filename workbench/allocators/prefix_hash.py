"""Keys of a prompt's full blocks: a hash chain over (parent key, block token ids), vectorized.

key[i] identifies the whole prefix of blocks 0..i, so equal keys mean equal prefixes (up to 64-bit
collisions, probability ~2^-64 per pair) and a block is reused only under an identical prefix.
The chain is H[i] = H[i-1] * B + c[i] (mod 2^64) over strong per-block content hashes c[i]; being
linear it unrolls into one prefix sum, H[i] = B^i * sum_{j<=i} c[j] * B^-j, so a 125k-token prompt
is hashed by a handful of numpy passes instead of a Python loop over blocks. Pure functions of the
token ids: identical across processes and runs (no salted Python hash).
"""

from __future__ import annotations

import numpy as np

from workbench.workload.request import mix64

_BASE = 0x9E3779B97F4A7C15 | 1  # odd, so it is invertible mod 2^64
_BASE_INV = pow(_BASE, -1, 2**64)


def block_keys(token_ids: np.ndarray, block_size: int) -> np.ndarray:
    """Chain keys of the full blocks of `token_ids` (int32 [n]), uint64 [n // block_size]."""
    num_full = token_ids.shape[0] // block_size
    if num_full == 0:
        return np.zeros(0, dtype=np.uint64)
    tokens = token_ids[:num_full * block_size].astype(np.uint64).reshape(num_full, block_size)
    salt = mix64(np.arange(block_size, dtype=np.uint64))  # [block_size]: position inside the block
    # [num_full]: a sum of strong hashes of distinct (position, token) pairs; equal only for equal blocks
    content = mix64(mix64(tokens ^ salt).sum(axis=1, dtype=np.uint64))
    powers_inv = np.cumprod(np.full(num_full, _BASE_INV, dtype=np.uint64), dtype=np.uint64) * np.uint64(_BASE)
    powers = np.cumprod(np.full(num_full, _BASE, dtype=np.uint64), dtype=np.uint64) * np.uint64(_BASE_INV)
    # powers_inv[i] = B^-i, powers[i] = B^i (cumprod starts at the first power; one factor undone)
    chain = powers * np.cumsum(content * powers_inv, dtype=np.uint64)
    return mix64(chain)
