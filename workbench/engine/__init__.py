"""One replica's engine: the scheduler and its admission, the step plan, the kernel runner and its KV
pool, and the loop that steps a replica through a workload (`simulation`).

Data flows workload -> scheduler (admission, decode batch, strategy) -> StepPlan -> kernel runner
(KV pool, kernels) and clock -> step rows. `run`, `simulate`, `check_config`, `RunResult` and
`StepTimers` are reachable here for notebooks, imported on first use so that importing one module
of the package (a GPU check reaching `engine.kvpool`) does not import the whole engine; modules of
the package import `workbench.engine.simulation` itself.
"""

_EXPORTS = ("RunResult", "StepTimers", "check_config", "run", "simulate")
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        from workbench.engine import simulation
        return getattr(simulation, name)
    raise AttributeError(f"module 'workbench.engine' has no attribute {name!r}")
