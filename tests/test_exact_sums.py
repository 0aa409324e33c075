"""The streamed sums equal NumPy's over the whole array, bit for bit, for any chunking."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.exact_sums import BufferedSum, PairwiseSum

LENGTHS = [0, 1, 7, 8, 9, 127, 128, 129, 130, 255, 256, 1000, 8191, 8192, 8193, 65_537, 228_329]


def _chunks(values: np.ndarray, rng: np.random.Generator):
    at = 0
    while at < values.shape[0]:
        size = int(rng.integers(1, 20_000))
        yield values[at:at + size]
        at += size


@pytest.mark.parametrize("n", LENGTHS)
def test_pairwise_sum_equals_numpy_sum_for_any_chunking(n):
    rng = np.random.default_rng(n)
    values = rng.random(n) * 10.0 ** rng.integers(-3, 9, n)  # wide magnitudes: the order shows in the last bits
    for chunks in ([values], list(_chunks(values, rng)), [values[i:i + 1] for i in range(min(n, 300))]):
        if sum(c.shape[0] for c in chunks) != n:
            continue
        total = PairwiseSum(n)
        for chunk in chunks:
            total.add(chunk)
        assert total.total() == float(np.sum(values))


@pytest.mark.parametrize("n", LENGTHS)
def test_buffered_sum_equals_numpy_mean_of_an_integer_column(n):
    rng = np.random.default_rng(n + 1)
    ints = rng.integers(0, 10**12, n)
    flags = rng.random(n) < 0.3
    a, b = BufferedSum(), BufferedSum()
    for chunk in _chunks(np.arange(n), rng):
        a.add(ints[chunk])
        b.add(flags[chunk])
    if n:
        assert a.total() / n == float(ints.mean())
        assert b.total() / n == float(flags.mean())
    assert a.count == b.count == n


def test_a_pairwise_sum_given_the_wrong_count_refuses_to_answer():
    total = PairwiseSum(10)
    total.add(np.ones(9))
    with pytest.raises(ValueError, match="10 values was given 9"):
        total.total()
