"""`python -m workbench.paper.fit_clock`: refit the `vllm-sosp23-a100` clock profile.

The profile's free constants are the achieved HBM bandwidth fraction (`eff_bw`) and the per-step
engine overhead (`step_overhead_s`); `eff_flops` keeps the roofline's GEMM curve and
`separate_prefill` is how vLLM 0.1 iterated. They are fitted, by grid search, to the paged (vLLM)
batch of the paper's Fig. 13 (values.yaml): with the pool full at ShareGPT 2 req/s and not at
Alpaca 30 req/s, those batches are the request rate times how long a request stays, i.e. the step
time at two very different batch shapes. Prints every grid point's residuals, best first.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools

from workbench.clock.profiles import PROFILES
from workbench.config import RunConfig
from workbench.engine.simulation import run
from workbench.experiments import builtin_dir
from workbench.paper.rows import load_values
from workbench.sweep.spec import load_spec

PROFILE = "vllm-sosp23-a100"
EFF_BW = (0.55, 0.65, 0.8)
STEP_OVERHEAD_S = (0.004, 0.008, 0.012, 0.016, 0.020, 0.024, 0.028)


@contextlib.contextmanager
def candidate(**constants):
    """Mutates PROFILES for this process only: the profile with `constants` while inside."""
    fitted = PROFILES[PROFILE]
    PROFILES[PROFILE] = dataclasses.replace(fitted, **constants)
    try:
        yield
    finally:
        PROFILES[PROFILE] = fitted


def targets() -> list[tuple[str, RunConfig, float]]:
    """(setting, the paged point of the Fig. 13 experiment, the paper's batch)."""
    entry = load_values()["fig13"]
    spec = load_spec(builtin_dir() / entry["experiment"])
    out = []
    for setting, systems in entry["rows"].items():
        kind = "sharegpt" if setting.startswith("sharegpt") else "alpaca"
        point = next(p for p in spec.points() if p.config.strategy == "paged" and kind in p.config.workload)
        out.append((setting, point.config, systems["paged"]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.paper.fit_clock", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    goals = targets()
    results = []
    for eff_bw, overhead_s in itertools.product(EFF_BW, STEP_OVERHEAD_S):
        with candidate(eff_bw=eff_bw, step_overhead_s=overhead_s):
            batches = [run(cfg)["mean_batch_size"] for _, cfg, _ in goals]
        residuals = [(b - paper) / paper for b, (_, _, paper) in zip(batches, goals, strict=True)]
        results.append((sum(r * r for r in residuals), eff_bw, overhead_s, batches, residuals))
        print(f"eff_bw {eff_bw:.2f}  step_overhead_s {overhead_s:.3f}  "
              + "  ".join(f"{setting}: {b:.1f} ({r:+.1%})"
                          for (setting, _, _), b, r in zip(goals, batches, residuals, strict=True)), flush=True)
    print("\nbest first:")
    for sq, eff_bw, overhead_s, batches, residuals in sorted(results)[:5]:
        print(f"eff_bw {eff_bw:.2f}  step_overhead_s {overhead_s:.3f}  rms residual {(sq / 2) ** 0.5:.1%}  "
              + "  ".join(f"{b:.1f} ({r:+.1%})" for b, r in zip(batches, residuals, strict=True)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
