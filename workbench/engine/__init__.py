"""One replica's engine: the scheduler and its admission, the step plan, the kernel runner and its KV
pool, and the loop that steps a replica through a workload (`simulate`, `run`).

Data flows workload -> scheduler (admission, decode batch, strategy) -> StepPlan -> kernel runner
(KV pool, kernels) and clock -> step rows. `run`, `simulate` and `check_config` are re-exported here
for notebooks; modules of the package import `workbench.engine.simulate` itself.
"""

from workbench.engine.simulate import RunResult, StepTimers, check_config, run, simulate

__all__ = ["RunResult", "StepTimers", "check_config", "run", "simulate"]
