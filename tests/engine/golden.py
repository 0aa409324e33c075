"""Golden outputs of the engine: every strategy on five workloads, Numba kernel verified every step.

`python -m tests.engine.golden --record [STRATEGY ...]` (re)records `golden_outputs.json` (`--compare
OLD.json` then lists every recorded value that changed, ignoring added summary keys; `--print` writes
the outputs computed here as JSON, for a run under another Numba CPU target); the test `test_golden.py`
recomputes each case and compares.

Two kinds of output, compared two ways. Exact, and identical on every machine: the summary less the
wall-clock figures and the kernel numerics, and a content hash of the steps and requests tables
(column names, dtypes and values), so any change to scheduling, allocation, accounting, the clock or
the kernels' inputs shows up. Kernel numerics (`C.KERNEL_NUMERIC_KEYS`: the verification error of the
attention output against the float64 reference): their last bits follow the CPU's vector width, so
they are held to the float32-rounding bound of the kernel tests, never compared bit for bit.
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
from tests.kernels.kernel_cases import TOLERANCE
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


# The verification error is a relative norm of float32 attention output against float64; every KV dtype
# gets the same bound (the reference dequantizes the very bits the pool stores)
TOLERANCE_FP32_ROUNDING = max(TOLERANCE.values())


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
    return outputs_of(simulate_checked(small_config(strategy=strategy, **WORKLOADS[workload])))


def outputs_of(result) -> dict:
    """A run's golden record: its summary (exact keys), kernel numerics and table hashes."""
    inexact = (*C.WALL_CLOCK_KEYS, *C.KERNEL_NUMERIC_KEYS)
    summary = {k: _plain(v) for k, v in result.summary.items() if k not in inexact}
    return {"summary": summary, "kernel_numerics": {k: _plain(result.summary[k]) for k in C.KERNEL_NUMERIC_KEYS},
            "steps_sha256": table_hash(result.steps), "requests_sha256": table_hash(result.requests)}


def exact_part(case: dict) -> dict:
    """What must be bit-identical on every machine: everything but the kernel numerics."""
    return {k: v for k, v in case.items() if k != "kernel_numerics"}


def numerics_problems(case: dict) -> list[str]:
    """Kernel numerics outside the float32-rounding bound of the kernel tests (NaN and inf included)."""
    return [f"{k} = {v!r} > {TOLERANCE_FP32_ROUNDING:.3g}" for k, v in case["kernel_numerics"].items()
            if v is None or not v <= TOLERANCE_FP32_ROUNDING]


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
    parser.add_argument("--print", action="store_true", help="print the outputs computed here as JSON")
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=sorted(WORKLOADS),
                        help="with --print: these workloads only")
    parser.add_argument("strategies", nargs="*", help="default: every registered strategy")
    args = parser.parse_args()
    if args.compare:
        changed = changed_values(json.loads(Path(args.compare).read_text()), load())
        print("\n".join(changed) or "no recorded value changed")
        raise SystemExit(1 if changed else 0)
    if not (args.record or args.print):
        parser.error("--record, --compare or --print is required")
    import numba
    numba.set_num_threads(1)
    if args.print:
        print(json.dumps({s: {w: outputs(s, w) for w in args.workloads} for s in args.strategies or registry.names()}))
        return
    golden = load()
    for strategy in args.strategies or registry.names():
        golden[strategy] = {w: outputs(strategy, w) for w in WORKLOADS}
        print(f"recorded {strategy}")
    GOLDEN_PATH.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
