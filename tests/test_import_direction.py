"""Imports point one way: no module of the package imports, even lazily or for type checking only, a
module that imports it back; and the layers keep their distance (allocators own integers only,
kernels know nothing of requests or strategies, sweeps know nothing of figures)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "workbench"

ENGINE_GENERAL = tuple(f"workbench.engine.{p.stem}" for p in (PACKAGE / "engine").glob("*.py") if p.stem != "__init__")
ENGINE_BELOW_THE_RUN = tuple(f"workbench.engine.{p.stem}" for p in (PACKAGE / "engine").glob("*.py")
                             if p.stem not in ("__init__", "simulation")) + ("workbench.engine.compiled_paged",)

# (importer prefix, forbidden prefix): the first never imports the second
_SCHEDULING = ("workbench.engine.scheduler", "workbench.engine.admission", "workbench.engine.decode_batch",
               "workbench.engine.prefill_chunks", "workbench.engine.plan", "workbench.engine.kernel_inputs")
FORBIDDEN = [
    ("workbench.allocators", "workbench.engine"), ("workbench.allocators", "workbench.clock"),
    ("workbench.allocators", "workbench.kernels"),
    ("workbench.kernels", "workbench.allocators"), ("workbench.kernels", "workbench.engine"),
    ("workbench.kernels", "workbench.workload"), ("workbench.kernels", "workbench.clock"),
    ("workbench.workload", "workbench.allocators"), ("workbench.workload", "workbench.engine"),
    ("workbench.clock", "workbench.engine"), ("workbench.clock", "workbench.allocators"),
    ("workbench.sweep", "workbench.figures"),
    # the scheduling side decides on integers: it never reaches device memory, kernels or the loop above it
    *[(m, f) for m in _SCHEDULING for f in ("workbench.engine.runner", "workbench.engine.kvpool", "workbench.kernels",
                                             "workbench.engine.simulation", "workbench.engine.replica")],
    # the engine knows strategies through their protocol (allocators.base) and the registry, never a concrete one;
    # the compiled loop (engine.compiled_paged) is its strategies', over their arrays with their compiled verbs
    *[(m, f"workbench.allocators.{kind}") for m in ENGINE_GENERAL
      for kind in ("paged", "prefix", "contiguous", "virtual")],
    # a fleet is replicas of the engine: it imports the engine's modules; of the engine, only the run's entry
    # (`simulation`, which builds a fleet when configured) imports the fleet
    *[(m, "workbench.fleet") for m in ENGINE_BELOW_THE_RUN],
]
MAX_FLOORS = 9  # import edges on the longest chain of the graph


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every workbench module this file imports, anywhere in it (module level, functions, TYPE_CHECKING)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("workbench")}


@cache  # the package does not change during a test session; parsing it once serves every layer rule
def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        targets = {t for t in imports_of(path) if t in modules and t != name}
        edges[name] = {t for t in targets if not name.startswith(t + ".")}  # a package's own __init__ is no edge
    return edges


def test_no_module_imports_a_module_that_imports_it_back():
    edges = graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycle = stack[stack.index(t):] + [t]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)


@pytest.mark.parametrize("importer,forbidden", FORBIDDEN)
def test_layers_keep_their_distance(importer, forbidden):
    # an entry point (`python -m ...`) is where layers are wired together, not a layer of its own
    offenders = sorted(f"{m} imports {t}" for m, targets in graph().items()
                       if m.startswith(importer) and not m.endswith(".__main__")
                       for t in targets if t.startswith(forbidden))
    assert not offenders, offenders


def longest_chain() -> list[str]:
    """The longest chain of imports (module -> a module it imports -> ...); its floors are its edges. Ties go
    to the first module by name, so that the chain reported is the same on every run."""
    edges = graph()
    depth: dict[str, int] = {}

    def floor(m: str) -> int:
        if m not in depth:
            depth[m] = 1 + max((floor(t) for t in edges[m]), default=-1)
        return depth[m]

    chain = [max(sorted(edges), key=floor)]
    while edges[chain[-1]]:
        chain.append(max(sorted(edges[chain[-1]]), key=floor))
    return chain


def floors_line() -> str:
    chain = longest_chain()
    return f"import floors: {len(chain) - 1} (at most {MAX_FLOORS}): " + " -> ".join(chain)


def test_the_import_graph_has_few_floors():
    """The longest chain of imports has at most MAX_FLOORS edges; the chain is printed (`pytest -s` or -rP
    shows it; `python tests/test_import_direction.py` prints it alone)."""
    print(floors_line())
    assert len(longest_chain()) - 1 <= MAX_FLOORS, floors_line()


if __name__ == "__main__":
    print(floors_line())
