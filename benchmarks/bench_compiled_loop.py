"""CPU of the compiled step loop itself (docs/performance.md), steadier than a whole process's.

Plain `paged` at `bench_engine.py`'s scale point (Llama-3-8B on an H100, 40 GiB of KV, `sharegpt-like` at
40 req/s, `--kernel none`): the run the compiled loop serves. In a fresh process per package, `--runs` runs
of `--requests` requests each, every call into the loop (`compiled_paged.drive`'s `_Run.call`: building its
arguments, the dispatch and the steps) timed; the first run, which loads the compiled code, is left out and
the least of the others printed, as CPU µs per simulated step. The whole process's figure (`bench_engine.py
--requests`) adds the workload, the tables written and the clock's Python, and on a shared machine its runs
spread by a third; the least of several runs of the loop alone moves by a few percent. `--baseline PATH` runs
another checkout the same way, alternating, `--sittings` times, and prints the ratio of each sitting and
their median.

    python benchmarks/bench_compiled_loop.py --requests 20000 --baseline ../old --sittings 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from bench_engine import SCALE_POINT, run_in_package

# one package's runs, in a fresh interpreter: prints {"steps": .., "loop_s": [..]}
_RUNS = """
import json, sys, tempfile, time
from pathlib import Path
from workbench.config import RunConfig
from workbench.engine.compiled_paged import drive
from workbench.engine.simulation import run
import pyarrow.parquet as pq
import workbench
if Path(workbench.__file__).resolve().parent.parent != Path(sys.argv[3]).resolve():
    sys.exit(f"imported {workbench.__file__}, not the package at {sys.argv[3]}")
spent = [0.0]
call = drive._Run.call
def timed_call(self):
    start = time.perf_counter()
    try:
        return call(self)
    finally:
        spent[0] += time.perf_counter() - start
drive._Run.call = timed_call
cfg = RunConfig(**{**json.loads(sys.argv[4]), "strategy": "paged", "num_requests": int(sys.argv[1])})
loop_s = []
for _ in range(int(sys.argv[2])):
    spent[0] = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        run(cfg, Path(tmp) / "out")
        steps = pq.ParquetFile(Path(tmp) / "out" / "steps.parquet").metadata.num_rows
    loop_s.append(spent[0])
if spent[0] == 0.0:
    sys.exit("the run did not take the compiled loop")
print(json.dumps({"steps": steps, "loop_s": loop_s}))
"""


def package_runs(package_root: Path, num_requests: int, runs: int) -> tuple[int, list[float]]:
    """(steps of a run, the loop's seconds in each run) of the package at `package_root`, in a fresh process."""
    done = run_in_package(package_root, _RUNS, str(num_requests), str(runs), str(package_root),
                          json.dumps(SCALE_POINT))
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise SystemExit(f"bench_compiled_loop: the runs of the package at {package_root} failed: {last}")
    result = json.loads(done.stdout.splitlines()[-1])
    return result["steps"], result["loop_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000, help="requests per run")
    parser.add_argument("--runs", type=int, default=6, help="runs per process (the first is left out)")
    parser.add_argument("--baseline", type=Path, help="another checkout, run the same way, alternating")
    parser.add_argument("--sittings", type=int, default=1, help="alternating sittings of both packages")
    args = parser.parse_args()
    if args.runs < 2 or args.sittings < 1 or args.requests < 1:
        raise SystemExit("bench_compiled_loop: --runs must be at least 2, --sittings and --requests at least 1")
    here = Path(__file__).resolve().parent.parent
    roots = [("this", here)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    print(f"plain paged, llama-3-8b on h100-sxm, 40 GiB KV, sharegpt-like at 40 req/s, {args.requests:,} requests; "
          f"the least of {args.runs - 1} runs per process")
    print(f"{'package':<9} {'steps':>9} {'loop_s':>8} {'us/step':>8} {'base/this':>9}  runs (s)")
    ratios = []
    for _ in range(args.sittings):
        least = {}
        for label, root in roots:
            steps, loop_s = package_runs(root, args.requests, args.runs)
            least[label] = min(loop_s[1:])
            ratio = f"{least[label] / least['this']:>9.2f}" if label == "baseline" else " " * 9
            print(f"{label:<9} {steps:>9,} {least[label]:>8.4f} {least[label] / steps * 1e6:>8.2f} {ratio}  "
                  + " ".join(f"{s:.4f}" for s in loop_s), flush=True)
        if "baseline" in least:
            ratios.append(least["baseline"] / least["this"])
    if len(ratios) > 1:
        print(f"base/this, median of {len(ratios)} sittings: {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
