"""trm_store: an append-only event log with projections, on SQLite or PostgreSQL, and the
optimisation loop's state (workspaces, runs, metrics, baseline cache, diagnoses) kept in it."""

from trm_store.domain.baseline import (
    INFRA_STOP_REASONS,
    BaselineCache,
    BaselineOutcome,
    BaselineQuestion,
)
from trm_store.domain.diagnosis import done_question_ids, read_diagnoses, record_diagnosis
from trm_store.domain.errors import (
    DomainConflictError,
    DomainInputError,
    DuplicateFinalMetricError,
    InfraOutcomeError,
    RunStateError,
    UnknownEntityError,
    UnknownRunError,
    UnknownWorkspaceError,
    WorkspaceExistsError,
)
from trm_store.domain.manifest_file import export_manifest
from trm_store.domain.metrics import read_dual_metric, write_dual_metric
from trm_store.domain.run_leases import mark_stale_runs
from trm_store.domain.run_log import RunLog
from trm_store.domain.runs import run_info
from trm_store.domain.workspace import (
    get_manifest,
    record_run,
    scaffold_workspace,
    update_best,
    update_manifest,
)
from trm_store.errors import (
    ConcurrencyError,
    EventValidationError,
    ReadOnlyStoreError,
    SchemaVersionError,
    StaleProjectionError,
    StoreError,
)
from trm_store.events import NewEvent, RecordedEvent, register_event_type
from trm_store.prepare import PreparedEvent
from trm_store.projections import Projection, register_projection
from trm_store.store import Store, open_store

__all__ = [
    "INFRA_STOP_REASONS",
    "BaselineCache",
    "BaselineOutcome",
    "BaselineQuestion",
    "ConcurrencyError",
    "DomainConflictError",
    "DomainInputError",
    "DuplicateFinalMetricError",
    "EventValidationError",
    "InfraOutcomeError",
    "NewEvent",
    "PreparedEvent",
    "Projection",
    "ReadOnlyStoreError",
    "RecordedEvent",
    "RunLog",
    "RunStateError",
    "SchemaVersionError",
    "StaleProjectionError",
    "Store",
    "StoreError",
    "UnknownEntityError",
    "UnknownRunError",
    "UnknownWorkspaceError",
    "WorkspaceExistsError",
    "done_question_ids",
    "export_manifest",
    "get_manifest",
    "mark_stale_runs",
    "open_store",
    "read_diagnoses",
    "read_dual_metric",
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
