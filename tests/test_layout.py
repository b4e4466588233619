"""The SPEC's layout: `trm_store.cli -> {trm_llm, trm_gate} -> trm_store`, checked over every
import of every module (lazy ones inside functions and `importlib.import_module("...")` too).
The generated docs are kept in sync by tests/test_docs.py."""

from __future__ import annotations

import pytest

from tests.imports import ROOT, imported_modules, module_imports, reaches

COMPOSITION_ROOT = "trm_store/cli/"
"""The one folder of trm_store that may wire the packages together."""

FORBIDDEN = {
    "trm_store": ("trm_llm", "trm_gate", "trm_store.cli"),  # the core: all of it but cli/
    "trm_llm": ("trm_gate", "trm_store.cli"),
    "trm_gate": ("trm_llm", "trm_store.cli"),
}
"""What the modules of each package (trm_store: outside COMPOSITION_ROOT) must never import."""


def _offenders(package: str, forbidden: str) -> list[str]:
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(COMPOSITION_ROOT):
            continue
        if reaches(module_imports(path), forbidden):
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
        imported |= module_imports(path)
    assert reaches(imported, "trm_llm") and reaches(imported, "trm_gate")


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
    assert reaches(found, "trm_store.cli") and not reaches({"trm_store.client"}, "trm_store.cli")
