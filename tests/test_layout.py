"""The SPEC's layout: `trm_store.cli -> {trm_llm, trm_gate} -> trm_store`, checked over every
import of every module (lazy ones inside functions and `importlib.import_module("...")` too).
The generated docs are kept in sync by tests/test_docs.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPOSITION_ROOT = "trm_store/cli/"
"""The one folder of trm_store that may wire the packages together."""

FORBIDDEN = {
    "trm_store": ("trm_llm", "trm_gate", "trm_store.cli"),  # the core: all of it but cli/
    "trm_llm": ("trm_gate", "trm_store.cli"),
    "trm_gate": ("trm_llm", "trm_store.cli"),
}
"""What the modules of each package (trm_store: outside COMPOSITION_ROOT) must never import."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """Every module `source` (the text of `module`) imports, as absolute dotted names: for
    `from a import b` both `a` and `a.b` (b may be a submodule); relative imports resolved."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    return found


def _reaches(imported: set[str], target: str) -> bool:
    return any(name == target or name.startswith(f"{target}.") for name in imported)


def _offenders(package: str, forbidden: str) -> list[str]:
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(COMPOSITION_ROOT):
            continue
        module = _module_name(path)
        imported = imported_modules(path.read_text(), module, is_package=path.name == "__init__.py")
        if _reaches(imported, forbidden):
            offenders.append(relative)
    return offenders


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [(package, target) for package, targets in FORBIDDEN.items() for target in targets],
)
def test_dependency_direction(package: str, forbidden: str) -> None:
    assert _offenders(package, forbidden) == []


def test_the_composition_root_is_where_the_packages_meet() -> None:
    """The check sees the imports it forbids elsewhere: the CLI reaches both packages."""
    imported: set[str] = set()
    for path in (ROOT / COMPOSITION_ROOT).rglob("*.py"):
        module = _module_name(path)
        imported |= imported_modules(
            path.read_text(), module, is_package=path.name == "__init__.py"
        )
    assert _reaches(imported, "trm_llm") and _reaches(imported, "trm_gate")


def test_imported_modules_sees_every_form_of_import() -> None:
    source = """
import trm_gate.step
from trm_store import cli
from . import sibling
from ..domain import gates
def lazy():
    import trm_llm
    importlib.import_module("trm_store.cli.demo")
"""
    found = imported_modules(source, "trm_store.core.module")
    assert {"trm_gate.step", "trm_store.cli", "trm_llm", "trm_store.cli.demo"} <= found
    assert {"trm_store.core.sibling", "trm_store.domain.gates"} <= found
    assert _reaches(found, "trm_store.cli") and not _reaches({"trm_store.client"}, "trm_store.cli")
