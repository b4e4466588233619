"""The store core's modules import each other without a circle, and each says its one job.

The graph is read from the source (AST) of every module of `trm_store` outside the composition
root (`trm_store/cli/`): every import counts, at module level, in a function or under
TYPE_CHECKING, since a circle through any of them is a circle in the design. The lazy package
front (`trm_store/__init__.py`) is left out: it names every public module without importing one.
`trm_store.domain` imports its modules by discovery (`load()`), so it gets an edge to each.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.imports import COMPOSITION_ROOT, ROOT, module_imports, module_name

PACKAGE = ROOT / "trm_store"


def _core_modules() -> dict[str, Path]:
    """The store core: every module of trm_store but the lazy front and the composition root."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if path == PACKAGE / "__init__.py" or name.startswith(COMPOSITION_ROOT):
            continue
        modules[name] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the core modules it imports."""
    modules = _core_modules()
    graph = {
        name: {m for m in module_imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }
    domain = "trm_store.domain"
    graph[domain] |= {m for m in modules if m.startswith(domain + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_store_core_imports_in_one_direction() -> None:
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_the_facade_knows_no_domain_and_the_bootstrap_loads_it() -> None:
    graph = import_graph()
    assert not {m for m in graph["trm_store.store"] if m.startswith("trm_store.domain")}
    assert "trm_store.domain" in graph["trm_store.bootstrap"]


@pytest.mark.parametrize("name", sorted(_core_modules()))
def test_each_module_opens_with_a_docstring_and_stays_small(name: str) -> None:
    path = _core_modules()[name]
    docstring = ast.get_docstring(ast.parse(path.read_text()))
    assert docstring, f"{name} has no docstring saying its job"
    if not name.startswith("trm_store.domain"):  # the domain's sizes are the domain's
        assert len(path.read_text().splitlines()) <= 300, f"{name} is over 300 lines"


def test_only_opening_a_store_loads_the_domain() -> None:
    """At run time too: the facade and the core load no domain module; `open_store` loads all."""
    program = """
import sys, tempfile
import trm_store.store, trm_store.append, trm_store.projection_rebuild
loaded = sorted(m for m in sys.modules if m.startswith("trm_store.domain"))
assert loaded == [], loaded
from trm_store import open_store
with tempfile.TemporaryDirectory() as d:
    open_store(f"sqlite:///{d}/t.db").close()
assert "trm_store.domain.runs" in sys.modules
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
