"""UniqueKeys reads like the array of keys it replaces, in any order and across its blocks."""

import numpy as np
import pytest

from workbench.workload.table import UniqueKeys, content_keys


@pytest.mark.parametrize("rows", [np.arange(10_000), np.random.default_rng(0).permutation(10_000)],
                         ids=["in arrival order", "shuffled"])
def test_unique_keys_equal_the_computed_array(rows):
    keys = UniqueKeys("unique/7", rows)
    expected = content_keys("unique/7", rows)
    assert len(keys) == expected.shape[0]
    assert np.array_equal(np.fromiter(keys, dtype=np.uint64), expected)
    for i in np.random.default_rng(1).integers(0, rows.shape[0], 300).tolist() + [0, 4095, 4096, 9999]:
        assert keys[i] == expected[i]
    with pytest.raises(IndexError):
        keys[10_000]
