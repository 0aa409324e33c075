"""A segment's token ids: the compiled loop against splitmix64 written in NumPy, and pinned ids (integer
hashing is exact, and every prefix hit of every golden run depends on these ids)."""

from __future__ import annotations

import numpy as np

from workbench.workload.request import VOCAB_SIZE, segment_token_ids, token_ids_for


def _numpy_tokens(keys, offsets):
    """The definition in NumPy operations: splitmix64 of offset ^ (key * 0x100000001B3), modulo the vocabulary."""
    with np.errstate(over="ignore"):
        z = np.asarray(offsets).astype(np.uint64) ^ (np.asarray(keys, dtype=np.uint64) * np.uint64(0x100000001B3))
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(VOCAB_SIZE)).astype(np.int32)


def test_compiled_tokens_equal_the_numpy_definition_elementwise_and_broadcast():
    rng = np.random.default_rng(7)
    for n in (0, 1, 17, 1000):
        keys = rng.integers(0, 2**64, n, dtype=np.uint64)
        offsets = rng.integers(0, 2**40, n)
        got = segment_token_ids(keys, offsets)
        assert got.dtype == np.int32 and got.shape == (n,)
        assert np.array_equal(got, _numpy_tokens(keys, offsets))
        key = np.uint64(rng.integers(0, 2**63))  # one segment, many offsets
        assert np.array_equal(segment_token_ids(key, np.arange(n)), _numpy_tokens(key, np.arange(n)))
        assert np.array_equal(token_ids_for(int(key), 5, 5 + n), _numpy_tokens(key, np.arange(5, 5 + n)))
    assert ((0 <= got) & (got < VOCAB_SIZE)).all()


def test_pinned_token_ids():
    assert token_ids_for(11, 0, 6).tolist() == [44388, 33433, 12369, 2948, 3929, 31977]
    assert token_ids_for(2**64 - 1, 1000, 1003).tolist() == [18589, 1497, 46867]
