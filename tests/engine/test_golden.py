"""Every registered strategy reproduces its recorded outputs exactly (tests/engine/golden.py)."""

from __future__ import annotations

import pytest

from tests.engine.golden import WORKLOADS, changed_values, load, outputs
from workbench.allocators.registry import names

GOLDEN = load()


def test_every_registered_strategy_has_golden_outputs():
    missing = [s for s in names() if s not in GOLDEN]
    assert not missing, f"no golden outputs for {missing}: record them with python -m tests.engine.golden --record NAME"


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("strategy", sorted(GOLDEN))
def test_outputs_match_the_recorded_ones(strategy, workload):
    expected = GOLDEN[strategy].get(workload)
    if expected is None:
        pytest.fail(f"{strategy} has no golden outputs for {workload}: record them with "
                    f"python -m tests.engine.golden --record {strategy}")
    got = outputs(strategy, workload)
    assert got["summary"] == expected["summary"]
    assert (got["steps_sha256"], got["requests_sha256"]) == (expected["steps_sha256"], expected["requests_sha256"])


def test_changed_values_ignores_added_keys_only():
    old = {"s": {"w": {"summary": {"a": 1}, "steps_sha256": "x", "requests_sha256": "y"}}}
    added = {"s": {"w": {"summary": {"a": 1, "b": 2}, "steps_sha256": "x", "requests_sha256": "y"}}}
    assert changed_values(old, added) == []
    moved = {"s": {"w": {"summary": {"a": 2}, "steps_sha256": "x", "requests_sha256": "z"}}}
    assert changed_values(old, moved) == ["s/w/requests_sha256", "s/w/summary.a"]
    assert changed_values(old, {}) == ["s/w: missing"]
