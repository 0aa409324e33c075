"""A sweep of many small points on a Dask cluster (or the local process pool): what each point costs beyond
its own simulation.

Runs POINTS points (a seed axis over one small configuration: `paged`, OPT-13B, 2 GiB of KV, 30 Alpaca-like
requests, `--kernel none`) with a progress bar, then prints one row from the points' own records: the
start-up (until every worker has written its first point: the cluster, the workers' imports and kernel
loading), the steady rate after it, a steady point's mean simulation time (its `sim_wall_s`: workload,
engine, summary) and the overhead per point in the steady part, i.e. what the executor adds to each point
(`steady wall × workers / points − mean simulation`: shipping the task, starting the run, writing its
four files and renaming them into place). Completion times are the points' summary.json times. Wall
times: run it on an otherwise idle machine.

    python benchmarks/bench_sweep.py [--points 1000] [--executor dask] [--workers 2] [--scheduler ADDRESS]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from workbench.sweep import make_executor, parse_spec, run_sweep

BASE = {"strategy": "paged", "block_size": 16, "model": "opt-13b", "kv_gib": 2, "workload": "alpaca-like",
        "rate": 8.0, "num_requests": 30, "kernel": "none"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--executor", choices=("dask", "local"), default="dask")
    parser.add_argument("--workers", type=int, default=None, help="LocalCluster workers or local pool processes")
    parser.add_argument("--scheduler", default=None, help="dask: address of a running scheduler")
    args = parser.parse_args()
    spec = parse_spec({"name": f"overhead-{args.points}", "base": BASE, "axes": {"seed": list(range(args.points))}},
                      max_points=None)
    if args.executor == "dask":
        executor = make_executor("dask", scheduler=args.scheduler, workers=args.workers)
        workers = args.workers or getattr(executor, "workers", 1)
    else:
        executor = make_executor("local", jobs=args.workers)
        workers = executor.jobs
    with tempfile.TemporaryDirectory() as tmp:
        start = time.time()
        table = run_sweep(spec, Path(tmp) / "sweep", executor=executor, progress=True)
        wall_s = time.time() - start
        done = sorted(((Path(tmp) / "sweep" / "points" / pid / "summary.json").stat().st_mtime - start, sim)
                      for pid, sim in zip(table["point_id"], table["sim_wall_s"], strict=True))
    # steady part: after every worker finished its first point (imports and kernel loading are start-up)
    first = min(workers, len(done)) - 1
    startup_s = done[first][0]
    steady_s = done[-1][0] - startup_s
    steady = done[first + 1:]
    sim_s = sum(sim for _, sim in steady) / len(steady) if steady else float("nan")
    rate = len(steady) / steady_s if steady_s > 0 else float("nan")
    overhead_ms = (steady_s * workers / len(steady) - sim_s) * 1e3 if steady else float("nan")
    where = args.scheduler or f"{'LocalCluster' if args.executor == 'dask' else 'process pool'} of {workers}"
    print(f"{'executor':<8} {'cluster':<22} {'points':>7} {'wall_s':>8} {'startup_s':>10} {'points/s':>9} "
          f"{'sim ms/point':>13} {'overhead ms/point':>18}")
    print(f"{args.executor:<8} {where:<22} {len(table):>7,} {wall_s:>8.1f} {startup_s:>10.1f} {rate:>9.2f} "
          f"{sim_s * 1e3:>13.1f} {overhead_ms:>18.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
