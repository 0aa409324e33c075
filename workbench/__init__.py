"""KV Workbench: measure KV-cache memory management strategies on real traces with real kernels.

    import workbench as wb
    result = wb.run(strategy="paged", rate=8)   # workbench.api: run, sweep, Result, strategies, models, ...
    wb.plot.memory(result)                       # workbench.plot: figures from a Result or a summary table

Everything here is imported on first use, so `import workbench` stays cheap.
"""

import importlib
import os

__version__ = "0.1.0"

# Arrow's own memory pool (mimalloc in its wheels) keeps the pages of buffers it has freed: reading a
# million-request run's tables back for its summary left ~70 MB resident. Chosen before pyarrow loads,
# its pool is the C heap's, whose free memory a run gives back (workbench.heap). A user's setting wins.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

# `run`, `sweep` and `traces` are modules (command-line tools) that can be called as functions of the API
_MODULES = ("run", "sweep", "traces", "plot", "api")
_API = ("Result", "load", "point", "flags", "strategies", "models", "gpus")
__all__ = ["ConfigError", *_API, *_MODULES]


def __getattr__(name: str):
    if name in _MODULES:
        return importlib.import_module(f"workbench.{name}")
    if name in _API:
        return getattr(importlib.import_module("workbench.api"), name)
    if name == "ConfigError":
        from workbench.errors import ConfigError
        return ConfigError
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
