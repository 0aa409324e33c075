"""The package's one splitmix64, and `elementwise`, which maps a compiled scalar rule such as it over arrays.
A leaf module: the KV pool hashes with it without importing the workload package (and with it pandas), so
the GPU path stays small."""

from __future__ import annotations

import numpy as np
from numba import njit, uint64


@njit(cache=True)
def mix(x):
    """splitmix64 finalizer of one uint64 (arithmetic wraps modulo 2^64), for compiled callers: the one
    statement of it, which `mix64` maps over arrays."""
    z = x + uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> uint64(30))) * uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> uint64(27))) * uint64(0x94D049BB133111EB)
    return z ^ (z >> uint64(31))


def mix64(x):
    """splitmix64 finalizer over a uint64 array of any shape (a new array) or one uint64 (a NumPy scalar):
    `mix` elementwise. A compiled loop, not NumPy's ten array operations: the engine calls it on a step's
    few blocks or sequences. Not a Numba ufunc either: loading one from the cache rebuilds its wrapper,
    ~0.1 s in every process that imports it."""
    return elementwise(_mix_into, np.uint64, np.asarray(x, dtype=np.uint64))


@njit(cache=True)
def _mix_into(x, out):
    for i in range(x.shape[0]):
        out[i] = mix(x[i])


def elementwise(loop, dtype, *args: np.ndarray):
    """`loop(*flat_args, out)`, a compiled loop over 1-D arrays of one length, applied to arrays that
    broadcast together: a new `dtype` array of their broadcast shape, or a NumPy scalar when every argument is
    0-d. An argument that already has that shape is passed as a flat view, not a copy (a decode step's batch).
    Plain loops, no generator: the engine calls it every decode step."""
    shapes = [a.shape for a in args]
    shape = shapes[0]
    if shapes.count(shape) != len(shapes):
        shape = np.broadcast_shapes(*shapes)
    flat = []
    for a in args:
        flat.append(a.reshape(-1) if a.shape == shape else np.broadcast_to(a, shape).flatten())
    out = np.empty(shape, dtype=dtype)
    loop(*flat, out.reshape(-1))
    return out if out.ndim else out[()]
