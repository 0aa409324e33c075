"""The KV pool of one layer (docs/kernels.md) and the deterministic K/V content written into it.

Content: the K/V row at position p of a sequence is a function of the hash of its whole prefix
(token ids 0..p and their positions), so identical prefixes have identical KV — sharing a block
is semantically valid — while the same token after a different prefix gets different KV, so a
block table pointing at the wrong block changes the attention result. Rows are sums of two
entries of fixed random tables picked by hash bits (16M combinations per head), which is cheap to
vectorize and keeps values in [-1, 1].
"""

from __future__ import annotations

import numpy as np
from numba import njit, uint64

from workbench import kernels
from workbench.kernels import fp8
from workbench.splitmix import mix, mix64

_TABLE_ROWS = 4096  # entries per content table; a row picks two of them (4096^2 combinations)
_TABLE_SEED = 0x5EED_C0DE  # content is a property of tokens, not of a run: one fixed seed
_POS_MUL = np.uint64(0xD6E8FEB86659FD93)
_TOKEN_MUL = np.uint64(0x9FB21C651E98DF25)
_HEAD_MUL = np.uint64(0xA0761D6478BD642F)
# bf16 held as uint16 bits, fp8 as uint8 e4m3 codes (per-tensor scale 1: content lies in [-1, 1])
STORAGE_DTYPES = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16, "fp8": np.uint8}
# The dtype K/V rows reach the cache write in: the pool's, except that an fp8 cache receives the model's
# fp16 rows and quantizes them in the write kernel (vLLM's kv_cache_dtype=fp8 under an fp16 model).
MODEL_DTYPES = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "fp8": "fp16"}


def content_terms(token_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Per-token terms of the content hash, uint64 [T]; a prefix's hash is the (wrapping) sum of its
    terms (not to be confused with the prefix cache's block hash, `allocators.prefix.keys`)."""
    with np.errstate(over="ignore"):
        return mix64(token_ids.astype(np.uint64) * _TOKEN_MUL ^ positions.astype(np.uint64) * _POS_MUL)


def prefix_sums(terms: np.ndarray, acc0: np.uint64 | int = 0) -> np.ndarray:
    """Running prefix hashes, uint64 [T]: element p covers every token up to and including p.
    NumPy integer sums wrap modulo 2^64, which is what a hash wants."""
    out = np.cumsum(terms, dtype=np.uint64)
    if acc0:
        with np.errstate(over="ignore"):
            out += np.uint64(acc0)
    return out


def to_storage(rows: np.ndarray, kv_dtype: str) -> np.ndarray:
    """float32 rows → the pool's storage dtype (bf16: round-to-nearest-even into uint16 bits; fp8: the
    cache write's e4m3 quantization)."""
    if kv_dtype == "fp8":
        return fp8.quantize(rows)
    if kv_dtype == "bf16":
        bits = np.ascontiguousarray(rows, dtype=np.float32).view(np.uint32)
        with np.errstate(over="ignore"):
            rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
        return (rounded >> np.uint32(16)).astype(np.uint16)
    return rows.astype(STORAGE_DTYPES[kv_dtype])


class KVContent:
    """K/V rows as a function of prefix hashes, for a layer of `num_kv_heads` × `head_dim`."""

    def __init__(self, num_kv_heads: int, head_dim: int, kv_dtype: str) -> None:
        rng = np.random.default_rng(_TABLE_SEED)
        # [4, _TABLE_ROWS, head_dim]: K low/high and V low/high halves, each in [-0.5, 0.5)
        self.tables = (rng.random((4, _TABLE_ROWS, head_dim), dtype=np.float32) - np.float32(0.5))
        self.num_kv_heads = num_kv_heads
        self.kv_dtype = kv_dtype

    def rows(self, prefix_hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(K, V) in storage dtype, each [T, num_kv_heads, head_dim], for uint64 prefix hashes [T]: what the
        pool holds after the write (fp8: the reference quantizer's codes of `model_rows`)."""
        k, v = self.model_rows(prefix_hashes)
        if self.kv_dtype == "fp8":
            return fp8.quantize(k), fp8.quantize(v)
        return k, v

    def model_rows(self, prefix_hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(K, V) in the dtype the cache write receives (MODEL_DTYPES), each [T, num_kv_heads, head_dim]."""
        shape = (prefix_hashes.shape[0], self.num_kv_heads, self.tables.shape[2])
        k, v = np.empty(shape, dtype=np.float32), np.empty(shape, dtype=np.float32)
        _content_rows(np.ascontiguousarray(prefix_hashes, dtype=np.uint64), self.tables, k, v)
        model_dtype = MODEL_DTYPES[self.kv_dtype]
        if model_dtype == "fp32":
            return k, v
        return to_storage(k, model_dtype), to_storage(v, model_dtype)


@njit(cache=True)
def _content_rows(prefix_hashes, tables, k, v):
    """K and V rows, float32 [T, H, head_dim] each, for uint64 prefix hashes [T]: per head, splitmix64 of the
    hash xor the head's salt picks four table rows by 12-bit fields; K is the sum of the first two, V of the
    last two. One compiled pass: the engine calls it for every step's writes and every verified sequence."""
    mask = uint64(_TABLE_ROWS - 1)
    for t in range(k.shape[0]):
        for h in range(k.shape[1]):
            x = mix(prefix_hashes[t] ^ (uint64(h) * _HEAD_MUL))
            k_lo, k_hi = x & mask, (x >> uint64(12)) & mask
            v_lo, v_hi = (x >> uint64(24)) & mask, (x >> uint64(36)) & mask
            for d in range(k.shape[2]):
                k[t, h, d] = tables[0, k_lo, d] + tables[1, k_hi, d]
                v[t, h, d] = tables[2, v_lo, d] + tables[3, v_hi, d]


def shared_tier_arrays(num_slots: int, num_kv_heads: int, head_dim: int, kv_dtype: str
                       ) -> tuple[np.ndarray, np.ndarray]:
    """K and V of a fleet's shared tier, host memory [num_slots, num_kv_heads, head_dim] each: built once
    and handed to every replica's KVPool, so a block one replica demotes is the block another promotes."""
    shape = (max(num_slots, 1), num_kv_heads, head_dim)
    return np.zeros(shape, dtype=STORAGE_DTYPES[kv_dtype]), np.zeros(shape, dtype=STORAGE_DTYPES[kv_dtype])


class KVPool:
    """Device K/V arrays [num_slots, num_kv_heads, head_dim] for one layer and a host swap pool.
    Every method mutates the arrays through the cache kernels of `backend`."""

    def __init__(self, num_slots: int, host_slots: int, num_kv_heads: int, head_dim: int, kv_dtype: str,
                 backend: str, tier_slots: int = 0, shared_kv: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """`shared_kv`: the fleet's shared tier (`shared_tier_arrays`), the same two arrays in every replica's
        pool; None without a shared tier."""
        self.backend = backend
        self.kv_dtype = kv_dtype
        dtype = STORAGE_DTYPES[kv_dtype]
        xp = np
        if backend == "cupy":
            import cupy as xp
        self.xp = xp
        self.k, self.v = self._device_arrays(num_slots, num_kv_heads, head_dim)  # [num_slots, num_kv_heads, head_dim]
        host_shape = (max(host_slots, 1), num_kv_heads, head_dim)
        self.host_k = np.zeros(host_shape, dtype=dtype)  # [host_slots, num_kv_heads, head_dim]
        self.host_v = np.zeros(host_shape, dtype=dtype)
        # a prefix cache's host tier (allocators.host_tier), host memory like the swap pool
        tier_shape = (max(tier_slots, 1), num_kv_heads, head_dim)
        self.tier_k = np.zeros(tier_shape, dtype=dtype)  # [tier_slots, num_kv_heads, head_dim]
        self.tier_v = np.zeros(tier_shape, dtype=dtype)
        self.shared_k, self.shared_v = shared_kv if shared_kv is not None else (None, None)

    def _device_arrays(self, num_slots: int, num_kv_heads: int, head_dim: int):
        """K and V, zeroed (NumPy's zeros are committed by the OS only where written, so a large virtual
        slot space costs the pages its rows touch)."""
        shape = (num_slots, num_kv_heads, head_dim)
        dtype = STORAGE_DTYPES[self.kv_dtype]
        return self.xp.zeros(shape, dtype=dtype), self.xp.zeros(shape, dtype=dtype)

    def close(self) -> None:
        """Mutates. Give back device memory held beyond the arrays' own (a virtual memory pool's mappings and
        ranges); nothing for plain arrays. The pool is not used afterwards; the engine calls this when a run
        ends, failed runs included."""

    def write(self, slots: np.ndarray, k_rows: np.ndarray, v_rows: np.ndarray) -> None:
        """Scatter rows [T, H, D] (storage dtype, or for an fp8 pool the model's fp16 rows, which the write
        quantizes with scale 1; host memory) into int64 `slots` [T]."""
        xp = self.xp
        kernels.cache_write(self.k, self.v, xp.asarray(k_rows), xp.asarray(v_rows),
                            xp.asarray(slots, dtype=np.int64), backend=self.backend)

    def copy_blocks(self, copies: np.ndarray, block_size: int) -> None:
        kernels.block_copy(self.k, self.v, self.xp.asarray(copies, dtype=np.int32), block_size,
                           backend=self.backend)

    def swap_out(self, moves: np.ndarray, block_size: int) -> None:
        self._move_blocks((self.k, self.v), (self.host_k, self.host_v), moves, block_size)

    def swap_in(self, moves: np.ndarray, block_size: int) -> None:
        self._move_blocks((self.host_k, self.host_v), (self.k, self.v), moves, block_size)

    def demote(self, moves: np.ndarray, block_size: int) -> None:
        """Copy device blocks into host-tier blocks: `moves` int32 [k, 2] (device block, tier block)."""
        self._move_blocks((self.k, self.v), (self.tier_k, self.tier_v), moves, block_size)

    def promote(self, moves: np.ndarray, block_size: int) -> None:
        """Copy host-tier blocks into device blocks: `moves` int32 [k, 2] (tier block, device block)."""
        self._move_blocks((self.tier_k, self.tier_v), (self.k, self.v), moves, block_size)

    def spill_shared(self, moves: np.ndarray, block_size: int) -> None:
        """Copy host-tier blocks into shared-tier blocks: `moves` int32 [k, 2] (tier block, shared block). Both
        sides are host memory (a memcpy, or an RDMA write into a remote pool): a NumPy copy on every backend."""
        src = _block_rows(moves[:, 0], block_size)
        dst = _block_rows(moves[:, 1], block_size)
        self.shared_k[dst] = self.tier_k[src]
        self.shared_v[dst] = self.tier_v[src]

    def demote_shared(self, moves: np.ndarray, block_size: int) -> None:
        """Copy device blocks into shared-tier blocks: `moves` int32 [k, 2] (device block, shared block)."""
        self._move_blocks((self.k, self.v), (self.shared_k, self.shared_v), moves, block_size)

    def promote_shared(self, moves: np.ndarray, block_size: int) -> None:
        """Copy shared-tier blocks into device blocks: `moves` int32 [k, 2] (shared block, device block)."""
        self._move_blocks((self.shared_k, self.shared_v), (self.k, self.v), moves, block_size)

    def _move_blocks(self, src, dst, moves: np.ndarray, block_size: int) -> None:
        """Copy (K, V) blocks of `src` into `dst`: `moves` int32 [k, 2] (source block, destination block)."""
        kernels.block_swap(*src, *dst, np.ascontiguousarray(moves, dtype=np.int32), block_size, backend=self.backend)


def _block_rows(blocks: np.ndarray, block_size: int) -> np.ndarray:
    """The slots of `blocks` (int32 [k]), block by block, int64 [k × block_size]."""
    return (blocks.astype(np.int64)[:, None] * block_size + np.arange(block_size)).ravel()
