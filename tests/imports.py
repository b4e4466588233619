"""What a module imports, read from its source (AST), for the layout tests; run as a script it
prints the import edges between trm's packages, so anyone can compare two trees:

    python -m tests.imports [ROOT]      # ROOT: a checkout (default: this one)

Every import counts: at module level, in a function, under TYPE_CHECKING, relative ones, and
`importlib.import_module("...")` calls with a literal name.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

__all__ = [
    "COMPOSITION_ROOT",
    "ROOT",
    "imported_modules",
    "module_imports",
    "module_name",
    "package_edges",
    "reaches",
]

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("trm_store", "trm_llm", "trm_gate")
COMPOSITION_ROOT = "trm_store.cli"
"""The one subpackage of trm_store that may wire the packages together."""


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
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


def module_imports(path: Path, root: Path = ROOT) -> set[str]:
    """What the module at `path` imports (see `imported_modules`)."""
    name = module_name(path, root)
    return imported_modules(path.read_text(), name, is_package=path.name == "__init__.py")


def reaches(imported: set[str], target: str) -> bool:
    return any(name == target or name.startswith(f"{target}.") for name in imported)


def _side(module: str) -> str:
    if module == COMPOSITION_ROOT or module.startswith(COMPOSITION_ROOT + "."):
        return COMPOSITION_ROOT
    return module.split(".")[0]


def package_edges(root: Path = ROOT) -> Counter[tuple[str, str]]:
    """(importing side, imported side) -> how many modules make that import, over the three
    packages with `trm_store.cli` as a side of its own (the old `cli_*.py`, `demo/` and
    `diagnose_job.py` count as trm_store: they sat in the core)."""
    edges: Counter[tuple[str, str]] = Counter()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            source = _side(module_name(path, root))
            targets = {_side(m) for m in module_imports(path, root) if m.split(".")[0] in PACKAGES}
            edges.update((source, target) for target in targets if target != source)
    return edges


if __name__ == "__main__":
    tree = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT
    for (source, target), count in sorted(package_edges(tree).items()):
        print(f"{source:>14} -> {target:<14} {count} module(s)")
