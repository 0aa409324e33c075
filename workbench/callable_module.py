"""A module that can also be called as a function of the public API.

`workbench.run`, `workbench.sweep` and `workbench.traces` each name a command-line tool (a module or
package) and a function of the public API. Python binds a submodule to its package's attribute once it
is imported, whatever the package defines, so the name is kept the module's and the module is made
callable: `workbench.run(strategy="paged")` runs whichever Python finds, and `import workbench.run`,
`python -m workbench.run` and the module's own attributes are untouched.
"""

from __future__ import annotations

import importlib
import sys
import types


def make_callable(module_name: str, target: str) -> None:
    """Calling the module `module_name` calls `target` ("module:function", imported on the first call)."""
    target_module, function = target.split(":")

    class CallableModule(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return getattr(importlib.import_module(target_module), function)(*args, **kwargs)

    CallableModule.__call__.__doc__ = f"Calls {target_module}.{function}: see its help."
    sys.modules[module_name].__class__ = CallableModule
