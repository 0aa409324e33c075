"""Workload loading speed: every shared trace and the synthetic generators, read and turned into Requests.

Prints one row per workload: requests, load seconds (best of 3), requests built per second, and the time
of the prefix-sharing potential at block size 16. Run: `python benchmarks/bench_workload.py`.
"""

from __future__ import annotations

import time

from workbench.config import RunConfig
from workbench.traces import TRACES, locate
from workbench.workload import load_workload
from workbench.workload.describe import prefix_sharing

SYNTHETIC = ["sharegpt-like", "alpaca-like", "system-prompt", "multi-turn"]


def _best_of(fn, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    specs = [(name, RunConfig(workload=name, num_requests=100_000)) for name in SYNTHETIC]
    specs += [(f"{t.format}:{t.name}", RunConfig(workload=f"{t.format}:{t.name}", max_model_len=1_000_000))
              for t in TRACES.values() if t.format is not None and locate(t.name) is not None]
    print(f"{'workload':<46} {'requests':>9} {'load_s':>8} {'req/s':>11} {'sharing_s':>9} {'hit':>6}")
    for name, cfg in specs:
        load_s, wl = _best_of(lambda cfg=cfg: load_workload(cfg))
        sharing_s, sharing = _best_of(lambda wl=wl: prefix_sharing(wl.requests, 16), repeats=1)
        print(f"{name:<46} {len(wl.requests):>9,} {load_s:>8.3f} {len(wl.requests) / load_s:>11,.0f} "
              f"{sharing_s:>9.3f} {100 * sharing.hit_frac:>5.1f}%")


if __name__ == "__main__":
    main()
