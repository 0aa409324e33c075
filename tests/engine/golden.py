"""Golden outputs of the engine: every strategy on five workloads, Numba kernel verified every step.

`python -m tests.engine.golden --record [STRATEGY ...]` (re)records `golden_outputs.json` (`--compare
OLD.json` then lists every recorded value that changed, ignoring added summary keys); the test
`test_golden.py` recomputes each case and compares. What is pinned: the summary (less the wall-clock
figures) and a content hash of the steps and requests tables (column names, dtypes and values), so
any change to scheduling, allocation, accounting or the kernels' inputs shows up.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from tests.engine.conftest import simulate_checked, small_config
from workbench import columns as C

GOLDEN_PATH = Path(__file__).with_name("golden_outputs.json")
MOONCAKE_FIXTURE = Path(__file__).parents[1] / "fixtures" / "traces" / "mooncake-conversation-short40.jsonl"

WORKLOADS = {
    # a tight pool: preemption by recompute happens
    "chat": dict(workload="sharegpt-like", num_requests=16, rate=20.0, kv_slots=1024, kv_dtype="fp32"),
    "chat-swap": dict(workload="sharegpt-like", num_requests=16, rate=20.0, kv_slots=1024, kv_dtype="fp16",
                      preemption="swap", swap_gib=0.0005),
    "parallel-n4": dict(workload="alpaca-like", n=4, num_requests=10, kv_dtype="fp16"),
    "beam4": dict(workload="alpaca-like", beam_width=4, num_requests=6, kv_dtype="fp32"),
    "system-prompt": dict(workload="system-prompt:k=2,system=40,lengths=alpaca", num_requests=16, kv_dtype="bf16"),
    "mooncake": dict(workload=f"mooncake:{MOONCAKE_FIXTURE}", num_requests=40, kv_slots=16384, kv_dtype="fp32",
                     model="custom:layers=2,kv_heads=2,heads=4,head_dim=16,params_b=0.1,max_model_len=2048",
                     block_size=16, kernel_every=4, verify_every=4),
}


def table_hash(frame: pd.DataFrame) -> str:
    """sha256 over column names, dtypes and values: stable across parquet writer versions."""
    h = hashlib.sha256()
    for name in frame.columns:
        col = frame[name]
        h.update(f"{name}:{col.dtype}\n".encode())
        if pd.api.types.is_numeric_dtype(col.dtype):
            h.update(np.ascontiguousarray(col.to_numpy()).tobytes())
        else:  # strings: their text, not the addresses of their objects
            h.update("\x1f".join(map(str, col.tolist())).encode())
    return h.hexdigest()


def _plain(value):
    if isinstance(value, float | np.floating):
        return None if math.isnan(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    return value


def outputs(strategy: str, workload: str) -> dict:
    result = simulate_checked(small_config(strategy=strategy, **WORKLOADS[workload]))
    summary = {k: _plain(v) for k, v in result.summary.items() if k not in C.WALL_CLOCK_KEYS}
    return {"summary": summary, "steps_sha256": table_hash(result.steps),
            "requests_sha256": table_hash(result.requests)}


def load() -> dict:
    return json.loads(GOLDEN_PATH.read_text()) if GOLDEN_PATH.exists() else {}


def changed_values(old: dict, new: dict) -> list[str]:
    """What `new` changes of `old` (strategy/workload/key), ignoring summary keys that `new` only adds:
    a commit that adds summary keys re-records every golden output and must leave this list empty
    (`python -m tests.engine.golden --compare OLD.json`)."""
    changed = []
    for strategy, cases in old.items():
        for workload, before in cases.items():
            after = new.get(strategy, {}).get(workload)
            if after is None:
                changed.append(f"{strategy}/{workload}: missing")
                continue
            changed += [f"{strategy}/{workload}/{k}" for k in ("steps_sha256", "requests_sha256")
                        if before[k] != after[k]]
            changed += [f"{strategy}/{workload}/summary.{k}" for k, v in before["summary"].items()
                        if after["summary"].get(k, object()) != v]
    return changed


def main() -> None:
    from workbench.allocators import registry

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--compare", metavar="OLD_JSON", help="list what the recorded outputs change of OLD_JSON")
    parser.add_argument("strategies", nargs="*", help="default: every registered strategy")
    args = parser.parse_args()
    if args.compare:
        changed = changed_values(json.loads(Path(args.compare).read_text()), load())
        print("\n".join(changed) or "no recorded value changed")
        raise SystemExit(1 if changed else 0)
    if not args.record:
        parser.error("--record or --compare is required")
    import numba
    numba.set_num_threads(1)
    golden = load()
    for strategy in args.strategies or registry.names():
        golden[strategy] = {w: outputs(strategy, w) for w in WORKLOADS}
        print(f"recorded {strategy}")
    GOLDEN_PATH.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
