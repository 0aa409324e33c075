from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest

# The trace registry is imported inside the helpers, not here: every test collects this file, and the
# GPU tests run on images without the trace store's dependencies (tqdm).

REPO = Path(__file__).parents[1]


@pytest.fixture
def real_trace():
    """`real_trace(NAME)` is the full public trace's file when it is already here (cache or shared
    folder); otherwise the test is skipped with one line that says how to get it."""
    from workbench.traces import locate

    def find(name: str) -> Path:
        path = locate(name)
        if path is None:
            pytest.skip(f"needs the full trace {name}: python -m workbench.traces fetch {name}")
        return path

    return find


def skip_without_traces_of(*experiment_yamls: Path) -> None:
    """Skip, with one line that says how to get them, when a registry trace these built-in experiments
    read is not here (cache or shared folder): tests never download."""
    from workbench.traces import TRACES, locate

    text = "".join(path.read_text() for path in experiment_yamls)
    missing = [name for name in TRACES if f":{name}" in text and locate(name) is None]
    if missing:
        pytest.skip(f"needs the full traces {', '.join(missing)}: python -m workbench.traces fetch NAME")


def shared_folder_of(name: str, purpose: str) -> Path:
    """The shared traces folder holding trace `name`; the test is skipped with one line when the
    folder (../shared/traces) or the trace's own sub-folder is not there."""
    from workbench.paths import shared_traces_dir
    from workbench.traces import TRACES

    folder = shared_traces_dir()
    if folder is None:
        pytest.skip(f"{purpose} ../shared/traces, which is not here (set WORKBENCH_SHARED_TRACES)")
    entry = TRACES[name]
    if not (folder / entry.folder).is_dir():
        pytest.skip(f"{name} is not among the shared traces (its own folder {entry.folder} is not there)")
    return folder


def numba_env_for_target(cpu_name: str, tmp_path: Path) -> dict[str, str]:
    """The environment of a subprocess that compiles the Numba kernels for CPU target `cpu_name`, with a
    cache of its own: beside the suite's (kept between runs, keyed on the sources like it) or a fresh one."""
    base = os.environ.get("NUMBA_CACHE_DIR")
    cache = f"{base}-{cpu_name}" if base else str(tmp_path / f"numba-{cpu_name}")
    env = {**os.environ, "NUMBA_CPU_NAME": cpu_name, "NUMBA_CACHE_DIR": cache, "PYTHONPATH": str(REPO)}
    env.pop("NUMBA_CPU_FEATURES", None)  # Numba's choice for the named CPU
    return env


def strategy_workload_grid(strategies: list[str], workloads: list[str], per_strategy: int = 2) -> list:
    """(strategy, workload) pytest params over the whole grid. In the quick run each strategy meets
    `per_strategy` workloads, rotating so that every workload is met by several strategies; the rest of
    the grid (the same paths, other pairings) is marked slow and runs in the full run."""
    params = []
    for i, strategy in enumerate(strategies):
        quick = {workloads[(i + k) % len(workloads)] for k in range(per_strategy)}
        params += [pytest.param(strategy, w, id=f"{strategy}-{w}", marks=() if w in quick else pytest.mark.slow)
                   for w in workloads]
    return params


def call_cli(main, argv: list[str]) -> tuple[int, str]:
    """(exit status, stderr) of a CLI main run in this process, stdout discarded; a traceback fails the test
    by propagating."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(argv)
        except SystemExit as exc:
            status = exc.code
    return status, err.getvalue()


# The longest test files of `make test`, longest first (its CPU times by file, on two cores). Under --dist
# loadfile a file runs whole on one worker, in collection order (xdist's reordering by test count is off in the
# Makefile), so a long file collected last would run alone at the end while the other core idles: these start
# first, and the many short files fill the gaps.
LONGEST_FILES = (
    "tests/figures/test_figures.py",
    "tests/notebooks/test_notebooks.py",
    "tests/engine/test_golden.py",
    "tests/kernels/test_nvrtc_compile.py",
    "tests/sweep/test_sweep_safety.py",
    "tests/test_output_streams.py",
    "tests/allocators/test_random_walks.py",
    "tests/sweep/test_sweep_runner.py",
    "tests/kernels/test_numba_cpu_targets.py",
    "tests/kernels/test_numba_process_determinism.py",
    "tests/sweep/test_sweep_cli.py",
    "tests/engine/test_preemption.py",
    "tests/allocators/test_hybrid_random_walks.py",
)


def pytest_collection_modifyitems(config, items):
    first = {path: rank for rank, path in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: first.get(item.nodeid.split("::")[0], len(first)))  # stable: the rest keep their order


# CPU seconds per test (setup, call and teardown; this process and the processes it waited for), reported
# beside pytest's wall-clock --durations: on a shared machine wall time mostly measures the neighbours.
# Each worker measures its own tests and sends the figure with the test's report.
CPU_SLOWEST = 15
_cpu_by_test: dict[str, float] = {}


def _cpu_s() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_CPU_START] = _cpu_s()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown":
        outcome.get_result().user_properties.append(("cpu_s", _cpu_s() - item.stash[_CPU_START]))


_CPU_START = pytest.StashKey[float]()


def pytest_runtest_logreport(report):
    for key, value in report.user_properties:
        if key == "cpu_s" and report.when == "teardown":
            _cpu_by_test[report.nodeid] = value


def pytest_terminal_summary(terminalreporter):
    if not _cpu_by_test or hasattr(terminalreporter.config, "workerinput"):
        return
    slowest = sorted(_cpu_by_test.items(), key=lambda item: -item[1])[:CPU_SLOWEST]
    terminalreporter.write_sep("=", f"{CPU_SLOWEST} largest CPU times (s, this test and the processes it ran)")
    for nodeid, cpu_s in slowest:
        terminalreporter.write_line(f"{cpu_s:8.2f}s  {nodeid}")
    by_file: dict[str, float] = {}
    for nodeid, cpu_s in _cpu_by_test.items():
        by_file[nodeid.split("::")[0]] = by_file.get(nodeid.split("::")[0], 0.0) + cpu_s
    terminalreporter.write_sep("-", f"{CPU_SLOWEST} largest CPU times by file")
    for path, cpu_s in sorted(by_file.items(), key=lambda item: -item[1])[:CPU_SLOWEST]:
        terminalreporter.write_line(f"{cpu_s:8.2f}s  {path}")
    terminalreporter.write_line(f"{sum(_cpu_by_test.values()):8.1f}s  in all {len(_cpu_by_test)} tests "
                                "(without pytest's own start and the kernel builds)")
