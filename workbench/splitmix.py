"""The package's one NumPy splitmix64, a leaf module: the KV pool hashes with it without importing the
workload package (and with it pandas), so the GPU path stays small."""

from __future__ import annotations

import numpy as np


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer, vectorized over uint64 (arithmetic wraps modulo 2^64). The one NumPy
    splitmix64 of the package; `allocators.prefix.loops` has its compiled twin."""
    with np.errstate(over="ignore"):  # uint64 scalars warn on the wrap that arrays do silently
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
