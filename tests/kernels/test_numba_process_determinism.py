"""The Numba attention kernel gives the same bits in a process that compiles it and in one that loads it
from the on-disk cache (docs/engine.md: same config and seed, bit-identical results)."""

from __future__ import annotations

import os
import subprocess
import sys

# fp32 and fp16, contiguous extend (several KV partitions, so the merge runs too) and paged decode; prints
# one hash of every output's bytes
_PROGRAM = """
import hashlib
import numpy as np
from workbench import kernels
rng = np.random.default_rng(1)
num_tokens, num_heads, head_dim, block_size = 700, 2, 128, 16
digest = hashlib.sha256()
for kv_dtype in ("fp32", "fp16"):
    k = (rng.random((num_tokens, num_heads, head_dim), dtype=np.float32) - 0.5).astype(kv_dtype.replace("fp", "float"))
    v = (rng.random((num_tokens, num_heads, head_dim), dtype=np.float32) - 0.5).astype(k.dtype)
    q = (rng.random((num_tokens, num_heads, head_dim), dtype=np.float32) - 0.5) * 8
    lengths = np.array([num_tokens], np.int32)
    out = kernels.contiguous_extend(q, np.array([0, num_tokens], np.int32), k, v, np.zeros(1, np.int32), lengths)
    digest.update(out.tobytes())
    num_blocks = num_tokens // block_size  # whole pages of the pool, in shuffled order
    indices = rng.permutation(num_blocks).astype(np.int32)
    out = kernels.paged_decode(q[:1], k, v, np.array([0, num_blocks], np.int32), indices,
                               np.array([block_size], np.int32), block_size)
    digest.update(out.tobytes())
print(digest.hexdigest())
"""


def _run(cache_dir) -> str:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_compiled_and_cached_kernel_give_identical_bits(tmp_path):
    compiled = _run(tmp_path)  # empty cache: compiles every kernel and writes the cache
    assert any(tmp_path.rglob("*.nbi")), "the first run should have written the Numba cache"
    cached = _run(tmp_path)  # loads every kernel from that cache
    assert cached == compiled
