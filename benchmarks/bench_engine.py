"""Engine speed on the Azure LLM conversation trace (docs/performance.md).

1. The whole trace (19,366 requests over ~3,500 s) with `paged` and `--kernel none`: simulated
   seconds per wall second (target >= 300) and per CPU second of this process (less sensitive to
   other load on a shared machine).
2. Where a step's time goes — scheduler, allocator (every strategy call, timed by a wrapper),
   kernel (block moves, cache writes, attention) and bookkeeping (clock, completion, step rows) —
   for the whole trace with `--kernel none`, and for a window of it with `--kernel numba
   --kernel-heads 8` (one layer of 8 KV and 32 query heads on this CPU: prefill attention of the
   trace's ~1,000-token prompts dominates).

Wall times are noisy on a shared machine: compare rows of one run.

    python benchmarks/bench_engine.py [--model llama-3-8b] [--gpu a100-80gb] [--window-s 20]
"""

from __future__ import annotations

import argparse
import sys
import time

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--gpu", default="a100-80gb")
    parser.add_argument("--window-s", type=float, default=20.0, help="trace window for the kernel run, seconds")
    args = parser.parse_args()
    try:
        path = resolve("azure-llm-2023-conv")  # cache, shared folder, else a verified download
    except TraceError as exc:
        print(f"bench_engine: {exc}", file=sys.stderr)
        return 1
    base = dict(strategy="paged", block_size=16, model=args.model, gpu=args.gpu, workload=f"azure:{path}")

    summary, wall_s, cpu_s, _ = replay(RunConfig(**base, kernel="none"), split=False)
    print(f"Azure conversation trace, paged, kernel none ({args.model} on {args.gpu})")
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
