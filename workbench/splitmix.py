"""The package's one splitmix64, a leaf module: the KV pool hashes with it without importing the workload
package (and with it pandas), so the GPU path stays small."""

from __future__ import annotations

from numba import njit, uint64, vectorize


@njit(cache=True)
def mix(x):
    """splitmix64 finalizer of one uint64 (arithmetic wraps modulo 2^64), for compiled callers: the one
    statement of it, which `mix64` maps over arrays."""
    z = x + uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> uint64(30))) * uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> uint64(27))) * uint64(0x94D049BB133111EB)
    return z ^ (z >> uint64(31))


# a compiled ufunc: the engine calls it on a step's few blocks or sequences, where NumPy's per-operation
# overhead (ten array operations and an error-state switch) would cost more than the hashing
@vectorize([uint64(uint64)], cache=True)
def mix64(x):
    """splitmix64 finalizer over uint64 arrays or scalars (`mix` elementwise)."""
    return mix(x)
