"""Every registered strategy reproduces its recorded outputs (tests/engine/golden.py): the exact part bit for
bit, the kernel numerics within float32 rounding; and so does a process compiling the kernels for another
Numba CPU target."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, numba_env_for_target
from tests.engine.golden import WORKLOADS, changed_values, exact_part, load, numerics_problems, outputs
from workbench.allocators.registry import names

GOLDEN = load()


def test_every_registered_strategy_has_golden_outputs():
    missing = [s for s in names() if s not in GOLDEN]
    assert not missing, f"no golden outputs for {missing}: record them with python -m tests.engine.golden --record NAME"


def test_recorded_kernel_numerics_are_within_float32_rounding():
    problems = {f"{s}/{w}": numerics_problems(case) for s, cases in GOLDEN.items() for w, case in cases.items()}
    assert not {k: v for k, v in problems.items() if v}


def _expected(strategy: str, workload: str) -> dict:
    expected = GOLDEN[strategy].get(workload)
    if expected is None:
        pytest.fail(f"{strategy} has no golden outputs for {workload}: record them with "
                    f"python -m tests.engine.golden --record {strategy}")
    return expected


# The quick run compares every strategy on every workload but the mooncake trace, which costs as much as the
# other five together. On it, the quick run keeps paged (the trace reader and the sampled kernels) and
# paged-prefix (prefix hits from the trace's hash ids, with kernels); radix's hits on the same trace are
# checked exactly in the quick run by test_prefix_bound, and the other strategies' mooncake outputs (no
# path of theirs that the other workloads miss) are compared in the full run.
QUICK_MOONCAKE = {"paged", "paged-prefix"}


def _golden_cases() -> list:
    return [pytest.param(s, w, id=f"{s}-{w}",
                         marks=pytest.mark.slow if w == "mooncake" and s not in QUICK_MOONCAKE else ())
            for s in sorted(GOLDEN) for w in sorted(WORKLOADS)]


@pytest.mark.parametrize(("strategy", "workload"), _golden_cases())
def test_outputs_match_the_recorded_ones(strategy, workload):
    got = outputs(strategy, workload)
    assert exact_part(got) == exact_part(_expected(strategy, workload))
    assert not numerics_problems(got)


# (Numba CPU target, workloads, strategies): every case in the full run (make test-all, CI). The narrow case, an
# fp16 run with preemption by swapping on one strategy per way the kernels address the pool (contiguous extents,
# a page table with prefix hits, pages mapped on demand), runs there too: its kernels compile afresh for the
# other target (17 s of CPU), while tests/kernels/test_numba_cpu_targets.py checks the kernels under another
# target in the quick run
OTHER_TARGETS = [
    pytest.param("x86-64", ("chat-swap",), ("contiguous-max", "paged-prefix", "virtual-contiguous"),
                 id="x86-64-narrow", marks=pytest.mark.slow),
    pytest.param("x86-64", tuple(sorted(WORKLOADS)), tuple(sorted(GOLDEN)), id="x86-64", marks=pytest.mark.slow),
]


@pytest.mark.parametrize(("cpu_name", "workloads", "strategies"), OTHER_TARGETS)
def test_golden_outputs_under_another_numba_cpu_target(cpu_name, workloads, strategies, tmp_path):
    """Kernels compiled for the x86-64 baseline (another vector width, another summation order) change the
    kernel numerics' last bits at most: memory, scheduling and timing tables stay identical."""
    command = [sys.executable, "-m", "tests.engine.golden", "--print", "--workloads", *workloads, "--", *strategies]
    done = subprocess.run(command, cwd=REPO,
                          env=numba_env_for_target(cpu_name, tmp_path),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    assert sorted(got) == sorted(strategies) and all(sorted(cases) == sorted(workloads) for cases in got.values())
    for strategy, cases in got.items():
        for workload, case in cases.items():
            assert exact_part(case) == exact_part(_expected(strategy, workload)), f"{strategy}/{workload}"
            assert not numerics_problems(case), f"{strategy}/{workload}"


def test_changed_values_ignores_added_keys_only():
    old = {"s": {"w": {"summary": {"a": 1}, "steps_sha256": "x", "requests_sha256": "y"}}}
    added = {"s": {"w": {"summary": {"a": 1, "b": 2}, "steps_sha256": "x", "requests_sha256": "y"}}}
    assert changed_values(old, added) == []
    moved = {"s": {"w": {"summary": {"a": 2}, "steps_sha256": "x", "requests_sha256": "z"}}}
    assert changed_values(old, moved) == ["s/w/requests_sha256", "s/w/summary.a"]
    assert changed_values(old, {}) == ["s/w: missing"]


def test_numerics_are_held_to_a_bound_not_to_bits():
    case = {"kernel_numerics": {"verify_max_rel_err": 6.9e-7}}
    assert numerics_problems(case) == []
    assert numerics_problems({"kernel_numerics": {"verify_max_rel_err": 1e-4}})
    assert numerics_problems({"kernel_numerics": {"verify_max_rel_err": None}})  # NaN is stored as null
