"""The exception tree of `trm_store`: every error the store (and its domain) raises on purpose.

Driver errors are translated at the backend boundary only (`trm_store.backend.store_error`): a
store method never lets SQLAlchemy's or the driver's own exceptions out. A plain `StoreError`
is a database failure (connection lost, disk full, locked past the busy timeout, corrupt file,
a trigger's refusal); its message names the store and the cause.

StoreError                             the database failed, or the base of every error below
 ├── ConcurrencyError                  a stream was not at the expected version; nothing written
 ├── EventIdConflictError              an event id names another event already; nothing written
 ├── ReadOnlyStoreError                a write on a store opened read_only=True, or a read-only db
 ├── StoreURLError                     a URL trm cannot honour, or a path that is no regular file
 ├── ForeignDatabaseError              not a trm store, with tables of its own (`adopt_database`)
 ├── SchemaVersionError                the database is not at the migration head (`alembic upgrade`)
 ├── StaleProjectionError              a read model is behind the log (`trm replay-projections`)
 ├── EventValidationError              an event (data, meta, type, id) is invalid; nothing written
 │    └── DomainInputError             domain: a facade argument is invalid (empty id, NaN, type)
 │         ├── InfraOutcomeError       domain: BaselineCache.put of a unit with an INFRA question
 │         └── DiagnoseInputError      domain: `trm diagnose` items, template or tiers unusable
 ├── DomainConflictError               domain: the command contradicts what the log holds
 │    ├── WorkspaceExistsError         scaffold_workspace of a workspace that exists
 │    ├── DuplicateFinalMetricError    a second `final` dual metric for (run, epoch, pool)
 │    └── RunStateError                a run written outside its life: finished, stale, nested
 ├── ManifestExportError               domain: export_manifest could not write its file
 └── UnknownEntityError                domain: the thing asked for was never recorded
      ├── UnknownWorkspaceError
      ├── UnknownRunError
      ├── UnknownGateError
      ├── UnknownCallError
      └── UnknownLLMSourceError

The classes marked `domain` and their subclasses are defined in `trm_store.domain.errors`; the
others here. `tests/store/test_exception_tree.py` keeps this drawing equal to the classes.
"""

from __future__ import annotations

__all__ = [
    "ConcurrencyError",
    "EventIdConflictError",
    "EventValidationError",
    "ForeignDatabaseError",
    "ReadOnlyStoreError",
    "SchemaVersionError",
    "StaleProjectionError",
    "StoreError",
    "StoreURLError",
]


class StoreError(Exception):
    """Base of every error the store raises on purpose."""


class ConcurrencyError(StoreError):
    """The stream's version differed from `expected_version`; the append wrote nothing."""

    def __init__(self, stream_id: str, expected: int, actual: int) -> None:
        super().__init__(
            f"stream {stream_id!r} is at version {actual}, expected {expected}; nothing was written"
        )
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual

    def __reduce__(self) -> tuple[type[ConcurrencyError], tuple[str, int, int]]:
        """Pickled with its own arguments (the default would call it with the message alone,
        and unpickling would fail): it crosses processes, e.g. from the sink's child writer."""
        return type(self), (self.stream_id, self.expected, self.actual)


class EventIdConflictError(StoreError):
    """An event id of the append already names another event; the append wrote nothing.

    The recorded event is at `version` of stream `stream_id`. Only a retry of the very same
    append (the same events: stream, type, data and meta) is answered with the recorded events;
    this is any other use of a recorded id: another stream, type, data or meta, or an append
    that resends only some of the events recorded under its ids.
    """

    def __init__(self, event_id: str, stream_id: str, version: int, why: str) -> None:
        super().__init__(
            f"event_id {event_id} names event {version} of stream {stream_id!r} already; {why}: "
            "nothing was written (a retry resends the very same events, a new event needs a "
            "new id)"
        )
        self.event_id = event_id
        self.stream_id = stream_id
        self.version = version
        self.why = why

    def __reduce__(self) -> tuple[type[EventIdConflictError], tuple[str, str, int, str]]:
        """Pickled with its own arguments, as `ConcurrencyError` is."""
        return type(self), (self.event_id, self.stream_id, self.version, self.why)


class ReadOnlyStoreError(StoreError):
    """A write was attempted through a store opened with read_only=True."""


class StoreURLError(StoreError):
    """The store URL cannot be honoured as written; nothing was opened or created."""


class ForeignDatabaseError(StoreError):
    """The database is not a trm store and holds tables of its own; nothing was added to it."""


class SchemaVersionError(StoreError):
    """The database schema is not at the head revision this code expects."""


class EventValidationError(StoreError):
    """Event data, meta or type is invalid; raised before anything is written."""


class StaleProjectionError(StoreError):
    """A projection is behind the event log or at another version than the code's."""
