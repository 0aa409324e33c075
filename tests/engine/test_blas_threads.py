"""The run summary and the verification error are the same bits whatever the BLAS thread count: a Dask
worker runs with one BLAS thread, a process-pool worker with the machine's default."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from workbench.paths import REPO_ROOT

# A long run's tables (200k steps: far above the size where a BLAS dot splits its sum across threads)
PROBE = """
import json
import numpy as np
import pandas as pd
from workbench import columns as C
from workbench.kernels.reference import rel_err
from workbench.results import summarize

rng = np.random.default_rng(7)
num_steps, num_requests = 200_000, 5_000
steps = pd.DataFrame({c: rng.integers(0, 5000, num_steps) for c in C.STEP_COLUMNS})
steps["dt_s"] = rng.random(num_steps)
steps["t_s"] = np.cumsum(steps["dt_s"])
steps["kernel_time_s"] = 0.0
arrival = np.sort(rng.random(num_requests)) * 100
requests = pd.DataFrame({"arrival_s": arrival, "first_token_s": arrival + rng.random(num_requests),
                         "output_tokens": rng.integers(1, 500, num_requests), "status": "finished"})
requests["finish_s"] = requests["first_token_s"] + rng.random(num_requests) * 10
extra = {"prefix_query_tokens": 10, "prefix_hit_tokens": 3, "kernel_backend": "numba", "kernel_time_s": 0.0,
         "kernel_gbps": 0.0, "verify_max_rel_err": 0.0, "sim_wall_s": 0.0}
summary = summarize(steps, requests, capacity_slots=123_457, generated_tokens=10**6, extra=extra)
out = rng.random((64, 32, 128))
summary["rel_err"] = rel_err(out + 1e-7 * rng.random(out.shape), out)
print(json.dumps({k: v.hex() if isinstance(v, float) else v for k, v in summary.items()}))
"""


def summary_bits(threads: int) -> dict:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads)}
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300,
                          cwd=REPO_ROOT, check=True)
    return json.loads(proc.stdout)


def test_summary_bits_do_not_depend_on_the_blas_thread_count():
    one, two = summary_bits(1), summary_bits(2)
    assert one == two
    assert one["mem_token_frac"] != (0.0).hex() and one["rel_err"] != (0.0).hex()  # real sums were compared
