"""`import trm_gate` loads no database library (issue 13 point 3): the pure core imports nothing
from trm_store but its leaf vocabulary, and `Gate` (which needs the store) loads on first use."""

from __future__ import annotations

import ast
from pathlib import Path

import trm_gate
from tests.light_imports import heavy_modules_loaded

PACKAGE = Path(trm_gate.__file__).parent
STORE_SIDE = {"gate.py", "resume.py", "asking.py"}  # the gate's driver, its take-over, its arm


def test_import_trm_gate_loads_no_database_library() -> None:
    assert heavy_modules_loaded("import trm_gate") == []
    core = "from trm_gate import GateConfig, run_blocks, e_accept, fold_units, pair_block, step"
    assert heavy_modules_loaded(core) == []


def test_gate_itself_still_loads_on_first_use() -> None:
    # The probe sees the store's libraries when something does load them.
    assert "sqlalchemy" in heavy_modules_loaded("from trm_gate import Gate")
    assert trm_gate.Gate.__module__ == "trm_gate.gate"
    assert "Gate" in dir(trm_gate)


def runtime_imports(path: Path) -> list[str]:
    """Modules a file imports when it runs (imports under `if TYPE_CHECKING:` left out)."""
    names: list[str] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                visit(node.orelse)
                continue
            for sub in ast.walk(node):
                if isinstance(sub, ast.Import):
                    names.extend(alias.name for alias in sub.names)
                elif isinstance(sub, ast.ImportFrom) and sub.module:
                    names.append(sub.module)

    visit(ast.parse(path.read_text()).body)
    return names


def test_the_core_imports_only_the_vocabulary_from_the_store() -> None:
    core = sorted(p for p in PACKAGE.glob("*.py") if p.name not in STORE_SIDE)
    assert {p.stem for p in core} >= {
        "results", "pairing", "eprocess", "step", "guard", "config", "errors", "_checks",
    }  # fmt: skip
    for path in core:
        imports = runtime_imports(path)
        store = {m for m in imports if m.split(".")[0] == "trm_store"}
        assert store <= {"trm_store.vocabulary"}, f"{path.name} imports {sorted(store)}"
        assert "trm_gate.gate" not in imports, f"{path.name} imports the store side eagerly"
