"""Engine speed on the Azure LLM conversation trace (docs/performance.md).

1. The whole trace (19,366 requests over ~3,500 s) with `paged` and `--kernel none`: simulated
   seconds per wall second (target >= 300) and per CPU second of this process (less sensitive to
   other load on a shared machine). This run is the plain `paged` case: the compiled step loop
   (docs/engine.md) runs it.
2. Where a step's time goes in the general loop (step timers send a run there) — scheduler,
   allocator (every strategy call, timed by a wrapper), kernel (block moves, cache writes, attention)
   and bookkeeping (clock, completion, step rows) — for the whole trace with `--kernel none`, and for
   a window of it with `--kernel numba --kernel-heads 8` (one layer of 8 KV and 32 query heads on
   this CPU: prefill attention of the trace's ~1,000-token prompts dominates).

3. With `--requests N` (repeatable), the scale rows instead: `paged` (or each `--strategy NAME`), Llama-3-8B on
   an H100, 40 GiB of KV, `sharegpt-like` at 40 req/s, `--kernel none` (for `paged` the compiled loop's plain
   case), N requests written
   to a temporary `--out`: steps, mean batch, CPU seconds of the run and CPU µs per simulated step, peak RSS,
   and the CPU seconds of the whole process (imports and Numba's one-time set-up, which the run's figures
   leave out, included), each row in a fresh process. `--baseline PATH` runs every row also with the package
   at PATH (another checkout), alternating, so before and after are measured side by side. `--set KEY=VALUE`
   and `--baseline-set
   KEY=VALUE` (repeatable) change a config field of this package's runs or the baseline's: a comparison
   across a clock change holds the operating point (steps and mean batch) with them. The per-operator
   clock's steps are ~1.4× longer than the single-roofline clock's at this config (mean batch ~200
   against ~148); `--set eff_bw=1.0 --set step_overhead_s=0.00075` brings this package back to the
   earlier clock's 228k steps at mean batch ~148 for 100k requests. `--general-loop` switches the compiled loop
   off in every row (this package's and the baseline's): plain `paged` then measures the general loop, the
   reference that the other strategies' cost per step is read against (docs/performance.md). With a baseline,
   the last column is the baseline's cost over this package's.
   `--repeat K` runs every row K times (this package's and the baseline's alternating each time) and adds a
   line with the medians. `--runs R` has each row's process run its config R times and report the least CPU
   of them: a busy machine's noise mostly adds time, so the least is steadier than one run.

Wall times are noisy on a shared machine: compare rows of one run.

    python benchmarks/bench_engine.py [--model llama-3-8b] [--gpu a100-80gb] [--window-s 20]
    python benchmarks/bench_engine.py --requests 100000 --requests 1000000 [--baseline ../main]
    python benchmarks/bench_engine.py --requests 20000 --strategy paged --strategy paged-prefix --baseline ../old
    python benchmarks/bench_engine.py --requests 100000 --baseline ../old --set eff_bw=1.0 --set step_overhead_s=0.00075
    python benchmarks/bench_engine.py --requests 20000 --general-loop --strategy paged --strategy radix
    python benchmarks/bench_engine.py --requests 20000 --strategy paged-prefix --baseline ../old \
        --set model=gpt-oss-120b --set kv_gib=20 --baseline-set model=gpt-oss-120b --baseline-set kv_gib=20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workbench.allocators import registry
from workbench.config import RunConfig
from workbench.engine import StepTimers, simulate
from workbench.errors import TraceError
from workbench.traces import resolve
from workbench.workload import build_workload

STRATEGY_METHODS = ("admit", "can_append", "append", "fork", "free", "slot_mapping", "describe", "snapshot",
                    "swap_out", "can_swap_out", "can_swap_in", "swap_in")


def make_strategy(cfg: RunConfig):
    return registry.create_from_config(cfg, cfg.resolve())


def timed_strategy(cfg: RunConfig, timers: StepTimers):
    """The configured strategy with every protocol call's wall time added to `timers.allocator_s`."""
    strategy = make_strategy(cfg)
    base = type(strategy)

    def timed(name):
        method = getattr(base, name)

        def call(self, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                timers.allocator_s += time.perf_counter() - t0
        return call

    strategy.__class__ = type(f"Timed{base.__name__}", (base,),
                              {name: timed(name) for name in STRATEGY_METHODS if hasattr(base, name)})
    return strategy


def replay(cfg: RunConfig, *, split: bool) -> tuple[dict, float, float, StepTimers]:
    requests = build_workload(cfg)
    timers = StepTimers()
    strategy = timed_strategy(cfg, timers) if split else make_strategy(cfg)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    result = simulate(cfg, requests, strategy, timers=timers if split else None)
    return result.summary, time.perf_counter() - wall0, time.process_time() - cpu0, timers


# the trace replay's model and GPU unless --model / --gpu say otherwise
TRACE_MODEL, TRACE_GPU = "llama-3-8b", "a100-80gb"

# the scale rows' operating point (num_requests and --set changes go on top)
SCALE_POINT = dict(strategy="paged", block_size=16, model="llama-3-8b", gpu="h100-sxm", kv_gib=40,
                   workload="sharegpt-like", rate=40.0, kernel="none")

# one scale row, run in a fresh interpreter: prints "steps cpu_s peak_rss_bytes"
_SCALE_ROW = """
import json, resource, sys, tempfile, time
from pathlib import Path
from workbench.config import RunConfig  # first, as in a user's run: the package picks Arrow's memory pool
from workbench.engine.simulation import run
import pyarrow.parquet as pq
from numba import njit
njit(lambda: 0)()  # Numba's one-time set-up (its first compile or cache load): start-up, like the imports
if sys.argv[4] == "general":
    from workbench.engine.compiled_paged import eligible
    eligible.ENABLED = False  # every run takes the general loop
cfg = RunConfig(**{**json.loads(sys.argv[5]), "num_requests": int(sys.argv[1]), **json.loads(sys.argv[3])})
cpu_s = float("inf")
with tempfile.TemporaryDirectory() as tmp:
    for i in range(int(sys.argv[6])):  # the least CPU of these runs (the same config and seed: the same outputs)
        cpu0 = time.process_time()
        run(cfg, Path(tmp) / f"out{i}")
        cpu_s = min(cpu_s, time.process_time() - cpu0)
    steps = pq.ParquetFile(Path(tmp) / "out0" / "steps.parquet").metadata.num_rows
    batch = json.loads((Path(tmp) / "out0" / "summary.json").read_text())["mean_batch_size"]
import workbench
if Path(workbench.__file__).resolve().parent.parent != Path(sys.argv[2]).resolve():
    sys.exit(f"imported {workbench.__file__}, not the package at {sys.argv[2]}")
usage = resource.getrusage(resource.RUSAGE_SELF)
print(steps, batch, cpu_s, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime)
"""


def scale_row(num_requests: int, package_root: Path, changes: dict,
              general: bool, runs: int = 1) -> tuple[int, float, float, int, float]:
    """(steps, mean batch, CPU s of the run, peak RSS bytes, CPU s of the whole process) of one scale run with
    the package at `package_root`, its config fields changed by `changes`; `general`: with the compiled step
    loop switched off; `runs` > 1: the run repeated in the same process, the CPU s of the run the least."""
    done = run_in_package(package_root, _SCALE_ROW, str(num_requests), str(package_root), json.dumps(changes),
                          "general" if general else "any", json.dumps(SCALE_POINT), str(runs))
    done.check_returncode()
    out = done.stdout.split()
    return int(out[0]), float(out[1]), float(out[2]), int(out[3]), float(out[4])


def run_in_package(package_root: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    """`python -c code args` in a fresh interpreter that imports the package at `package_root` (its stdout and
    stderr captured, not checked)."""
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    with tempfile.TemporaryDirectory() as cwd:  # `python -c` puts the working directory first on sys.path
        return subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=cwd, capture_output=True, text=True)


def scale_table(counts: list[int], strategies: list[str], baseline: Path | None, changes: dict,
                baseline_changes: dict, general: bool, repeat: int = 1, runs: int = 1) -> None:
    here = Path(__file__).resolve().parent.parent
    roots = [("this", here, changes)] + ([("baseline", baseline, baseline_changes)] if baseline is not None else [])
    p = SCALE_POINT
    print(f"{p['model']} on {p['gpu']}, {p['kv_gib']} GiB KV, {p['workload']} at {p['rate']:g} req/s, kernel "
          f"{p['kernel']} (unless --set says otherwise)"
          + (", every run through the general loop" if general else "")
          + (f"; cpu_s and us/step: the least of {runs} runs in each process" if runs > 1 else ""))
    for label, _, fields in roots:
        if fields:
            print(f"{label}: " + ", ".join(f"{k}={v}" for k, v in fields.items()))
    print(f"{'strategy':<20} {'package':<9} {'requests':>9} {'steps':>9} {'batch':>6} {'cpu_s':>8} {'us/step':>8} "
          f"{'peak RSS MB':>12} {'process_s':>9} {'base/this':>9}")
    for strategy in strategies:
        for n in counts:
            per_step_us: dict[str, list[float]] = {label: [] for label, _, _ in roots}
            for _ in range(repeat):
                this_us = None
                for label, root, fields in roots:  # alternating: the same load on both
                    steps, batch, cpu_s, rss, process_s = scale_row(n, root, {"strategy": strategy, **fields},
                                                                    general, runs)
                    us = cpu_s / steps * 1e6
                    per_step_us[label].append(us)
                    this_us = us if this_us is None else this_us
                    ratio = f"{us / this_us:>9.2f}" if label == "baseline" else ""
                    print(f"{strategy:<20} {label:<9} {n:>9,} {steps:>9,} {batch:>6.1f} {cpu_s:>8.1f} "
                          f"{us:>8.1f} {rss / 1e6:>12.0f} {process_s:>9.1f} {ratio}", flush=True)
            if repeat > 1:
                print(medians_line(strategy, n, per_step_us), flush=True)


def medians_line(strategy: str, num_requests: int, per_step_us: dict[str, list[float]]) -> str:
    """The median CPU µs per step of each package's repeated rows, with their range, and the baseline's median
    over this package's."""
    medians = {label: statistics.median(values) for label, values in per_step_us.items()}
    parts = [f"{label} {medians[label]:.1f} ({min(values):.1f}-{max(values):.1f})"
             for label, values in per_step_us.items()]
    if "baseline" in medians:
        parts.append(f"base/this {medians['baseline'] / medians['this']:.2f}")
    return f"{strategy:<20} median of {len(per_step_us['this'])} at {num_requests:,}: " + ", ".join(parts)


def config_changes(pairs: list[str] | None) -> dict:
    """`KEY=VALUE` pairs as config fields, each value read as JSON (a number) or else as a string."""
    changes = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"bench_engine: --set wants KEY=VALUE, got {pair!r}")
        try:
            changes[key] = json.loads(value)
        except json.JSONDecodeError:
            changes[key] = value
    return changes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help=f"the trace replay's model (default {TRACE_MODEL}); scale rows take "
                        "--set model=NAME")
    parser.add_argument("--gpu", help=f"the trace replay's GPU (default {TRACE_GPU}); scale rows take --set gpu=NAME")
    parser.add_argument("--window-s", type=float, default=20.0, help="trace window for the kernel run, seconds")
    parser.add_argument("--requests", type=int, action="append", help="scale rows: requests per run (repeatable)")
    parser.add_argument("--strategy", action="append", help="with --requests: the strategy of a set of rows "
                        "(repeatable; default paged)")
    parser.add_argument("--baseline", type=Path, help="with --requests: a checkout to run each row with too")
    parser.add_argument("--general-loop", action="store_true",
                        help="with --requests: every run through the general loop (the compiled step loop off), "
                        "so plain `paged` is the reference of the other strategies' cost per step")
    parser.add_argument("--repeat", type=int, default=1,
                        help="with --requests: run each row this many times, alternating with the baseline's, and "
                        "print the medians (a shared machine's noise is often larger than the change measured)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="with --requests: a config field of this package's runs (repeatable)")
    parser.add_argument("--baseline-set", action="append", metavar="KEY=VALUE",
                        help="with --requests: a config field of the baseline's runs (repeatable)")
    parser.add_argument("--runs", type=int, default=1,
                        help="with --requests: each process runs its row this many times and reports the least "
                        "CPU of them (steadier than one run on a busy machine; leaves out the first run's one-time "
                        "costs once a later run is cheaper)")
    args = parser.parse_args()
    for name in ("repeat", "runs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.requests and (args.model or args.gpu):  # the scale rows hold their own operating point
        parser.error("--model and --gpu set the trace replay; with --requests use --set model=NAME / --set gpu=NAME "
                     "(and --baseline-set for the baseline's rows)")
    if args.requests:
        scale_table(args.requests, args.strategy or ["paged"], args.baseline, config_changes(args.set),
                    config_changes(args.baseline_set), args.general_loop, args.repeat, args.runs)
        return 0
    try:
        path = resolve("azure-llm-2023-conv")  # cache, shared folder, else a verified download
    except TraceError as exc:
        print(f"bench_engine: {exc}", file=sys.stderr)
        return 1
    model, gpu = args.model or TRACE_MODEL, args.gpu or TRACE_GPU
    base = dict(strategy="paged", block_size=16, model=model, gpu=gpu, workload=f"azure:{path}")

    summary, wall_s, cpu_s, _ = replay(RunConfig(**base, kernel="none"), split=False)
    print(f"Azure conversation trace, paged, kernel none ({model} on {gpu})")
    print(f"{'requests':>9} {'sim_s':>9} {'wall_s':>8} {'cpu_s':>8} {'sim/wall':>9} {'sim/cpu':>8}")
    print(f"{summary['num_requests']:>9} {summary['sim_time_s']:>9.1f} {wall_s:>8.2f} {cpu_s:>8.2f} "
          f"{summary['sim_time_s'] / wall_s:>9.0f} {summary['sim_time_s'] / cpu_s:>8.0f}   (target sim/wall >= 300)")

    print()
    for kernel, heads, window_s in (("none", None, None), ("numba", 8, args.window_s)):
        cfg = RunConfig(**base, kernel=kernel, kernel_heads=heads, duration=window_s)
        summary, wall_s, cpu_s, t = replay(cfg, split=True)
        total = t.scheduler_s + t.allocator_s + t.kernel_s + t.bookkeeping_s
        label = f"kernel {kernel}" + (f", {heads} kv heads" if heads else "")
        span = "the whole trace" if window_s is None else f"the first {window_s:g} s of the trace"
        print(f"per-step split, {span}, {label}: {t.steps} steps, {summary['num_requests']} requests, "
              f"{summary['mean_batch_size']:.1f} seqs/step on average")
        print(f"{'part':<12} {'us/step':>9} {'share':>7}")
        for name, value in (("scheduler", t.scheduler_s), ("allocator", t.allocator_s), ("kernel", t.kernel_s),
                            ("bookkeeping", t.bookkeeping_s), ("total", total)):
            print(f"{name:<12} {value / t.steps * 1e6:>9.1f} {value / total:>7.1%}")
        if kernel != "none":
            attention_us = summary["kernel_time_s"] / t.steps * 1e6
            print(f"of the kernel part, attention kernels alone: {attention_us:.1f} us/step (the rest: K/V "
                  f"content, cache writes); KV read bandwidth {summary['kernel_gbps']:.2f} GB/s")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
