"""trm_store: an append-only event log with projections, on SQLite or PostgreSQL, and the
optimisation loop's state (workspaces, runs, metrics, baseline cache, diagnoses) kept in it.

Names load on first use (PEP 562), so `import trm_store.vocabulary` (which the gate's pure core
does) loads no database library; `from trm_store import open_store` works as always.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trm_store.bootstrap import (
        open_store,
    )
    from trm_store.domain.baseline import (
        BaselineCache,
        BaselineOutcome,
        BaselineQuestion,
    )
    from trm_store.domain.diagnosis import (
        done_question_ids,
        read_diagnoses,
        record_diagnosis,
    )
    from trm_store.domain.errors import (
        DiagnoseInputError,
        DomainConflictError,
        DomainInputError,
        DuplicateFinalMetricError,
        InfraOutcomeError,
        ManifestExportError,
        RunStateError,
        UnknownCallError,
        UnknownEntityError,
        UnknownGateError,
        UnknownLLMSourceError,
        UnknownRunError,
        UnknownWorkspaceError,
        WorkspaceExistsError,
    )
    from trm_store.domain.gate_leases import (
        mark_stale_gates,
    )
    from trm_store.domain.gate_report import (
        GateReport,
        read_gate_report,
    )
    from trm_store.domain.llm_calls.stats import (
        LLMSourceStats,
        llm_stats,
    )
    from trm_store.domain.manifest_file import (
        export_manifest,
    )
    from trm_store.domain.metrics import (
        read_dual_metric,
        write_dual_metric,
    )
    from trm_store.domain.run_leases import (
        mark_stale_runs,
    )
    from trm_store.domain.run_list import (
        RunListing,
        list_runs,
    )
    from trm_store.domain.run_log import (
        RunLog,
    )
    from trm_store.domain.runs import (
        run_info,
    )
    from trm_store.domain.workspace import (
        get_manifest,
        record_run,
        scaffold_workspace,
        update_best,
        update_manifest,
    )
    from trm_store.errors import (
        ConcurrencyError,
        EventIdConflictError,
        EventValidationError,
        ForeignDatabaseError,
        ReadOnlyStoreError,
        SchemaVersionError,
        StaleProjectionError,
        StoreError,
        StoreURLError,
    )
    from trm_store.events import (
        NewEvent,
        RecordedEvent,
        register_event_type,
    )
    from trm_store.prepared import (
        PreparedEvent,
    )
    from trm_store.projections import (
        Projection,
        register_projection,
    )
    from trm_store.store import (
        Store,
    )
    from trm_store.vocabulary import (
        INFRA_STOP_REASONS,
        STOP_REASONS,
    )

_EXPORTS: dict[str, str] = {
    "BaselineCache": "trm_store.domain.baseline",
    "BaselineOutcome": "trm_store.domain.baseline",
    "BaselineQuestion": "trm_store.domain.baseline",
    "ConcurrencyError": "trm_store.errors",
    "DiagnoseInputError": "trm_store.domain.errors",
    "DomainConflictError": "trm_store.domain.errors",
    "DomainInputError": "trm_store.domain.errors",
    "DuplicateFinalMetricError": "trm_store.domain.errors",
    "EventIdConflictError": "trm_store.errors",
    "EventValidationError": "trm_store.errors",
    "GateReport": "trm_store.domain.gate_report",
    "INFRA_STOP_REASONS": "trm_store.vocabulary",
    "InfraOutcomeError": "trm_store.domain.errors",
    "ManifestExportError": "trm_store.domain.errors",
    "LLMSourceStats": "trm_store.domain.llm_calls.stats",
    "NewEvent": "trm_store.events",
    "PreparedEvent": "trm_store.prepared",
    "Projection": "trm_store.projections",
    "ForeignDatabaseError": "trm_store.errors",
    "ReadOnlyStoreError": "trm_store.errors",
    "RecordedEvent": "trm_store.events",
    "RunListing": "trm_store.domain.run_list",
    "RunLog": "trm_store.domain.run_log",
    "RunStateError": "trm_store.domain.errors",
    "STOP_REASONS": "trm_store.vocabulary",
    "SchemaVersionError": "trm_store.errors",
    "StoreURLError": "trm_store.errors",
    "StaleProjectionError": "trm_store.errors",
    "Store": "trm_store.store",
    "StoreError": "trm_store.errors",
    "UnknownCallError": "trm_store.domain.errors",
    "UnknownEntityError": "trm_store.domain.errors",
    "UnknownGateError": "trm_store.domain.errors",
    "UnknownLLMSourceError": "trm_store.domain.errors",
    "UnknownRunError": "trm_store.domain.errors",
    "UnknownWorkspaceError": "trm_store.domain.errors",
    "WorkspaceExistsError": "trm_store.domain.errors",
    "done_question_ids": "trm_store.domain.diagnosis",
    "export_manifest": "trm_store.domain.manifest_file",
    "get_manifest": "trm_store.domain.workspace",
    "list_runs": "trm_store.domain.run_list",
    "llm_stats": "trm_store.domain.llm_calls.stats",
    "mark_stale_gates": "trm_store.domain.gate_leases",
    "mark_stale_runs": "trm_store.domain.run_leases",
    "open_store": "trm_store.bootstrap",
    "read_diagnoses": "trm_store.domain.diagnosis",
    "read_dual_metric": "trm_store.domain.metrics",
    "read_gate_report": "trm_store.domain.gate_report",
    "record_diagnosis": "trm_store.domain.diagnosis",
    "record_run": "trm_store.domain.workspace",
    "register_event_type": "trm_store.events",
    "register_projection": "trm_store.projections",
    "run_info": "trm_store.domain.runs",
    "scaffold_workspace": "trm_store.domain.workspace",
    "update_best": "trm_store.domain.workspace",
    "update_manifest": "trm_store.domain.workspace",
    "write_dual_metric": "trm_store.domain.metrics",
}
"""Each public name and the module that defines it."""

__all__ = [
    "INFRA_STOP_REASONS",
    "STOP_REASONS",
    "BaselineCache",
    "BaselineOutcome",
    "BaselineQuestion",
    "ConcurrencyError",
    "DiagnoseInputError",
    "DomainConflictError",
    "DomainInputError",
    "DuplicateFinalMetricError",
    "EventIdConflictError",
    "EventValidationError",
    "ForeignDatabaseError",
    "GateReport",
    "InfraOutcomeError",
    "LLMSourceStats",
    "ManifestExportError",
    "NewEvent",
    "PreparedEvent",
    "Projection",
    "ReadOnlyStoreError",
    "RecordedEvent",
    "RunListing",
    "RunLog",
    "RunStateError",
    "SchemaVersionError",
    "StaleProjectionError",
    "Store",
    "StoreError",
    "StoreURLError",
    "UnknownCallError",
    "UnknownEntityError",
    "UnknownGateError",
    "UnknownLLMSourceError",
    "UnknownRunError",
    "UnknownWorkspaceError",
    "WorkspaceExistsError",
    "done_question_ids",
    "export_manifest",
    "get_manifest",
    "list_runs",
    "llm_stats",
    "mark_stale_gates",
    "mark_stale_runs",
    "open_store",
    "read_diagnoses",
    "read_dual_metric",
    "read_gate_report",
    "record_diagnosis",
    "record_run",
    "register_event_type",
    "register_projection",
    "run_info",
    "scaffold_workspace",
    "update_best",
    "update_manifest",
    "write_dual_metric",
]


def __getattr__(name: str) -> object:
    """Import the module behind a public name on first access, and keep the value."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trm_store' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
