"""The public API is exactly what `__all__` says, and every name in it exists; trm_store's names
are exactly these, each loaded lazily from the one module the type checker sees it come from."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import trm_store

STORE_NAMES = {
    # the event log (SPEC §6)
    "open_store",
    "Store",
    "NewEvent",
    "RecordedEvent",
    "PreparedEvent",
    "register_event_type",
    "Projection",
    "register_projection",
    "INFRA_STOP_REASONS",
    "STOP_REASONS",
    # the core's errors
    "StoreError",
    "ConcurrencyError",
    "EventIdConflictError",
    "ForeignDatabaseError",
    "ReadOnlyStoreError",
    "SchemaVersionError",
    "StoreURLError",
    "EventValidationError",
    "StaleProjectionError",
    # the domain facades (SPEC §6)
    "scaffold_workspace",
    "update_manifest",
    "record_run",
    "update_best",
    "get_manifest",
    "export_manifest",
    "RunLog",
    "run_info",
    "mark_stale_runs",
    "mark_stale_gates",
    "write_dual_metric",
    "read_dual_metric",
    "BaselineCache",
    "BaselineOutcome",
    "BaselineQuestion",
    "record_diagnosis",
    "read_diagnoses",
    "done_question_ids",
    # the domain queries
    "list_runs",
    "RunListing",
    "read_gate_report",
    "GateReport",
    "llm_stats",
    "LLMSourceStats",
    # the domain's errors
    "DomainInputError",
    "InfraOutcomeError",
    "ManifestExportError",
    "DiagnoseInputError",
    "DomainConflictError",
    "WorkspaceExistsError",
    "DuplicateFinalMetricError",
    "RunStateError",
    "UnknownEntityError",
    "UnknownWorkspaceError",
    "UnknownRunError",
    "UnknownGateError",
    "UnknownCallError",
    "UnknownLLMSourceError",
}


@pytest.mark.parametrize("package", ["trm_store", "trm_llm", "trm_gate"])
def test_all_names_exist(package: str) -> None:
    module = importlib.import_module(package)
    exported = getattr(module, "__all__", None)
    assert exported, f"{package} has no __all__"
    missing = [name for name in exported if not hasattr(module, name)]
    assert missing == []


def test_store_exports_exactly_its_public_names() -> None:
    assert set(trm_store.__all__) == STORE_NAMES
    assert len(trm_store.__all__) == len(STORE_NAMES)  # no name twice


def test_each_lazy_name_comes_from_the_module_the_type_checker_sees() -> None:
    """`_EXPORTS` (what runs) and the TYPE_CHECKING imports (what mypy sees) name the same
    modules for the same names, and neither holds a name `__all__` lacks."""
    tree = ast.parse(Path(trm_store.__file__).read_text())
    checked: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.module
                checked.update({alias.name: statement.module for alias in statement.names})
    assert checked == trm_store._EXPORTS
    assert set(checked) == set(trm_store.__all__)


def test_the_spec_names_keep_working() -> None:
    from trm_store import (
        BaselineCache,
        NewEvent,
        RunLog,
        Store,
        StoreError,
        UnknownCallError,
        UnknownGateError,
        UnknownLLMSourceError,
        done_question_ids,
        open_store,
        run_info,
    )

    assert callable(open_store) and callable(run_info) and callable(done_question_ids)
    assert isinstance(NewEvent("t", {}), NewEvent)
    assert all(isinstance(c, type) for c in (BaselineCache, RunLog, Store))
    for error in (UnknownCallError, UnknownGateError, UnknownLLMSourceError):
        assert issubclass(error, trm_store.UnknownEntityError)
        assert issubclass(error, StoreError)
    assert issubclass(trm_store.DiagnoseInputError, trm_store.DomainInputError)
