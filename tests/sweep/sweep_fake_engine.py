"""A deterministic stand-in for `workbench.engine.run` for the sweep machinery's own tests.

It writes the run file set (docs/outputs.md) with values that are a pure function of the configuration (so resumed and
uninterrupted sweeps must agree), a wall-clock key that differs between runs (so comparisons must
exclude WALL_CLOCK_KEYS), can be slowed down (SWEEP_FAKE_SLEEP_S) so a test can kill a sweep mid-run,
and records each execution (SWEEP_FAKE_LOG_DIR) so a test can count runs per point.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from pathlib import Path

import pandas as pd

from workbench.code_version import code_version
from workbench.columns import REQUEST_COLUMNS, STEP_COLUMNS, SUMMARY_KEYS, WALL_CLOCK_KEYS
from workbench.config import RunConfig
from workbench.sweep import config_id


def fake_run(cfg: RunConfig, out_dir: Path | None = None, *, progress: bool = False) -> dict:
    start = time.perf_counter()
    time.sleep(float(os.environ.get("SWEEP_FAKE_SLEEP_S", "0")))
    if cfg.seed == 666:
        raise RuntimeError("seed 666 is cursed")
    digest = hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True).encode()).digest()
    summary: dict = {key: digest[i % len(digest)] / 255 for i, key in enumerate(SUMMARY_KEYS)}
    summary["kernel_backend"] = "none"
    summary["num_requests"] = cfg.num_requests or 100
    summary["kv_slots"] = cfg.kv_slots or 4096
    summary["sim_wall_s"] = time.perf_counter() - start + 1e-9 * time.time_ns() % 1.0
    assert set(WALL_CLOCK_KEYS) <= set(summary)
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.json").write_text(json.dumps({"config": cfg.to_dict(), **code_version()}))
        pd.DataFrame({c: [0, 1] for c in STEP_COLUMNS}).to_parquet(out_dir / "steps.parquet")
        pd.DataFrame({c: [0] for c in REQUEST_COLUMNS}).to_parquet(out_dir / "requests.parquet")
        (out_dir / "numba_threads.txt").write_text(_numba_threads())
        (out_dir / "summary.json").write_text(json.dumps(summary))
        log_dir = os.environ.get("SWEEP_FAKE_LOG_DIR")
        if log_dir:
            Path(log_dir, f"{config_id(cfg)}-{uuid.uuid4().hex}").touch()
    return summary


def _numba_threads() -> str:
    """The parallel threads this process's Numba kernels would use: its setting once Numba is imported (a worker
    that imported it before its point caps it there), else the variable Numba will read at its import."""
    import sys

    if "numba" in sys.modules:
        import numba

        return str(numba.get_num_threads())
    return os.environ.get("NUMBA_NUM_THREADS", "")


class SerialExecutor:
    """Runs the points in this process, one after another: for tests of what the sweep's own process
    decides (paths, kept points), where spawning workers would only cost time."""

    threads_per_task = None

    def map_unordered(self, fn, tasks):
        for task in tasks:
            yield fn(task)
