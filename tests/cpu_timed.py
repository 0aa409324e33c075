"""`python tests/cpu_timed.py COMMAND...`: run COMMAND and print the CPU seconds it and every process it
started used (user + system, from getrusage of the waited-for children), beside the wall seconds. `make test`
runs the suite through it, so the line under pytest's 15 slowest tests is the suite's CPU budget (550 s,
the five minutes of two cores the README promises)."""

from __future__ import annotations

import resource
import subprocess
import sys
import time

CPU_BUDGET_S = 550


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python tests/cpu_timed.py COMMAND...", file=sys.stderr)
        return 2
    start_s = time.perf_counter()
    status = subprocess.call(argv)
    wall_s = time.perf_counter() - start_s
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = used.ru_utime + used.ru_stime
    print(f"CPU: {cpu_s:.0f} s ({used.ru_utime:.0f} s user + {used.ru_stime:.0f} s system; budget {CPU_BUDGET_S} s), "
          f"wall {wall_s:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
