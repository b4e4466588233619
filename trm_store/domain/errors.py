"""Every public error of trm_store's domain and of the `trm` CLI: all StoreError subclasses, and
nothing is written when one is raised. The whole tree, core and domain, is drawn once, in
`trm_store.errors` (kept equal to the classes by tests/store/test_exception_tree.py)."""

from __future__ import annotations

from trm_store.errors import EventValidationError, StoreError

__all__ = [
    "DiagnoseInputError",
    "DomainConflictError",
    "DomainInputError",
    "DuplicateFinalMetricError",
    "InfraOutcomeError",
    "ManifestExportError",
    "RunStateError",
    "UnknownCallError",
    "UnknownEntityError",
    "UnknownGateError",
    "UnknownLLMSourceError",
    "UnknownRunError",
    "UnknownWorkspaceError",
    "WorkspaceExistsError",
]


class DomainInputError(EventValidationError):
    """A domain facade was called with invalid arguments; nothing was written."""


class InfraOutcomeError(DomainInputError):
    """An INFRA unit (a question ended in `error` or `parse_error`) must never be cached."""

    def __init__(self, snapshot: str, unit_id: str, question_ids: list[str]) -> None:
        super().__init__(
            f"baseline unit {unit_id!r} (snapshot {snapshot!r}) has INFRA question(s) "
            f"{question_ids}: an infrastructure failure is not a model outcome and is not cached"
        )
        self.snapshot = snapshot
        self.unit_id = unit_id
        self.question_ids = question_ids

    def __reduce__(self) -> tuple[type[InfraOutcomeError], tuple[str, str, list[str]]]:
        """Pickled with its own arguments, as `trm_store.errors.ConcurrencyError` is."""
        return type(self), (self.snapshot, self.unit_id, self.question_ids)


class DiagnoseInputError(DomainInputError):
    """The items file, the template or the tier list cannot be used; nothing was sent or written."""


class DomainConflictError(StoreError):
    """The command contradicts recorded state; nothing was written."""


class WorkspaceExistsError(DomainConflictError):
    """The workspace was scaffolded already."""


class DuplicateFinalMetricError(DomainConflictError):
    """(run, epoch, pool) has a `final` dual metric already; at most one is allowed."""


class RunStateError(DomainConflictError):
    """A RunLog was used outside its `with` block, or written through with register_run=False."""


class ManifestExportError(StoreError):
    """export_manifest could not write its file (a missing directory, no permission, a full
    disk); the file it would have replaced is untouched."""


class UnknownEntityError(StoreError):
    """The entity asked for has no events in the log."""


class UnknownWorkspaceError(UnknownEntityError):
    """No workspace with this id was scaffolded."""


class UnknownRunError(UnknownEntityError):
    """No run with this id was registered."""


class UnknownGateError(UnknownEntityError):
    """No gate with this id was started."""


class UnknownCallError(UnknownEntityError):
    """No LLM call with this id was recorded."""


class UnknownLLMSourceError(UnknownEntityError):
    """No LLM call or breaker change was recorded for this source."""
