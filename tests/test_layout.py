"""The SPEC's dependency direction (trm_llm -> trm_store <- trm_gate) and generated docs in sync."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The `trm` CLI is the composition root: only these trm_store modules may reach the other packages.
COMPOSITION_ROOT = ("cli_", "demo/", "diagnose_job.py")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("trm_llm", "trm_gate"),
        ("trm_gate", "trm_llm"),
        ("trm_store", "trm_llm"),
        ("trm_store", "trm_gate"),
    ],
)
def test_dependency_direction(package: str, forbidden: str) -> None:
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        relative = path.relative_to(ROOT / package).as_posix()
        if package == "trm_store" and relative.startswith(COMPOSITION_ROOT):
            continue
        if forbidden in _imports(path):
            offenders.append(relative)
    assert offenders == []
