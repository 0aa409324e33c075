"""Every module outside the standard library that the GPU check's code path imports, and whether this Python has it.

    python benchmarks/gpu_imports.py      # one line per module; exit 4 when any is missing

Needs only the standard library, so it runs first on a bare GPU image and says what to install, instead of
the tests failing at collection and reading as a kernel failure. The list is not typed in: it is read from
the sources (`ast`), starting at the files the check runs (ROOTS; of COLLECTED, the conftest files pytest
loads with them, only the module level) and following every import of a
`workbench` module, of a test helper beside a test, and every string that names a `workbench` module (the
kernel backends are imported by name). Imports inside a `try` that catches ImportError are optional and
left out; `pytest.importorskip("x")` counts as an import of x (a skip would hide the GPU tests).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("tests/kernels/test_cupy_gpu.py", "tests/kernels/test_vmm_gpu.py", "benchmarks/gpu_warmup.py",
         "benchmarks/bench_gpu_kernels.py")
# pytest imports these for every test it collects; only their module level runs for the GPU tests
COLLECTED = ("tests/conftest.py",)
PACKAGE = "workbench"
MISSING_EXIT = 4
_OPTIONAL_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _guarded_lines(tree: ast.AST) -> set[int]:
    """Line numbers inside a `try` body whose handlers catch a failed import."""
    lines = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try):
            continue
        caught = set()
        for handler in node.handlers:
            kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            caught |= {"Exception" if k is None else getattr(k, "id", getattr(k, "attr", "")) for k in kinds}
        if caught & _OPTIONAL_ERRORS:
            for statement in node.body:
                lines.update(range(statement.lineno, statement.end_lineno + 1))
    return lines


def _lazy_exports(tree: ast.Module) -> set[int]:
    """Line numbers of a module-level `__getattr__` (PEP 562): what it imports runs when a caller asks the
    package for one of its attributes by that name, which the GPU path does not (`workbench.engine`'s
    `run` and `simulate` for notebooks)."""
    return {line for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
            for line in range(node.lineno, node.end_lineno + 1)}


def _nodes(tree: ast.Module, module_level_only: bool):
    """Every node of `tree`, or those outside function bodies."""
    if not module_level_only:
        yield from ast.walk(tree)
        return
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            pending.extend(ast.iter_child_nodes(node))


def imports_of(path: Path, module_level_only: bool = False) -> set[str]:
    """Dotted names of the modules `path` needs: its imports (anywhere, or only at module level; optional
    ones left out), the modules passed to pytest.importorskip, and string constants naming a module of the
    package."""
    tree = ast.parse(path.read_text(), str(path))
    optional = _guarded_lines(tree) | _lazy_exports(tree)
    found = set()
    for node in _nodes(tree, module_level_only):
        if getattr(node, "lineno", None) in optional:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            if node.module == PACKAGE or node.module.startswith(PACKAGE + "."):
                found.update(f"{node.module}.{a.name}" for a in node.names)  # `from workbench import kernels`
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "importorskip" and node.args
              and isinstance(node.args[0], ast.Constant)):
            found.add(node.args[0].value)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and node.value.startswith(PACKAGE + ".") and node.value.replace(".", "").replace("_", "").isalnum()):
            found.add(node.value)
    return found


def package_file(repo: Path, name: str) -> Path | None:
    """The source file of `workbench...` module `name` under `repo` (None when `name` is an attribute)."""
    base = repo.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def external_imports(roots=ROOTS, collected=COLLECTED, repo: Path = REPO) -> dict[str, set[str]]:
    """{module outside the standard library and the package: the files that import it}, over the import
    closure of `roots` and the module level of `collected` (paths relative to `repo`). A module whose parent
    package is listed is left out (numba.extending comes with numba)."""
    pending = [(repo / r, False) for r in roots] + [(repo / c, True) for c in collected]
    seen: set[Path] = set()
    external: dict[str, set[str]] = {}
    while pending:
        path, module_level_only = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imports_of(path, module_level_only):
            top = name.split(".")[0]
            local = path.parent / f"{top}.py"  # a test helper imported from beside the test (kernel_cases)
            if top == PACKAGE:
                parts = name.split(".")
                # a module's parent packages run their __init__ first
                files = [package_file(repo, ".".join(parts[:i])) for i in range(1, len(parts) + 1)]
                pending += [(f, False) for f in files if f is not None]
            elif local.is_file():
                pending.append((local, False))
            elif top not in sys.stdlib_module_names and top != "__future__":
                external.setdefault(name, set()).add(str(path.relative_to(repo)))
    parents = set(external)
    return {name: files for name, files in external.items()
            if not any(name.startswith(p + ".") for p in parents)}


def installed(name: str, distributions: dict[str, list[str]]) -> str | None:
    """The version of the distribution providing module `name` ("?" when unknown), or None when missing.
    `distributions`: importlib.metadata.packages_distributions()."""
    try:
        if importlib.util.find_spec(name) is None:
            return None
    except (ImportError, ValueError):  # a missing parent package
        return None
    dists = distributions.get(name.split(".")[0], [])  # a namespace package (cuda) has several: prefer the named one
    dist = next((d for d in dists if name.split(".")[-1] in d.lower()), dists[0] if dists else None)
    return importlib.metadata.version(dist) if dist else "?"


def main() -> int:
    external = external_imports()
    distributions = importlib.metadata.packages_distributions()
    print(f"  python          {sys.version.split()[0]} ({sys.executable})")
    missing = []
    for name in sorted(external):
        version = installed(name, distributions)
        if version is None:
            missing.append(name)
            print(f"  {name:<15} MISSING, imported by {', '.join(sorted(external[name]))}")
        else:
            print(f"  {name:<15} {version}")
    if missing:
        print(f"  missing: {' '.join(missing)}")
        return MISSING_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
