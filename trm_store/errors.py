"""The store's exception tree; driver errors are translated at the backend boundary only.

StoreError
 ├── ConcurrencyError        a stream was not at the expected version; nothing was written
 ├── ReadOnlyStoreError      a write was attempted on a store opened read_only=True
 ├── SchemaVersionError      the database is not at the migration head (run `alembic upgrade head`)
 ├── EventValidationError    an event did not validate against its registered model; nothing written
 └── StaleProjectionError    a read model is behind the log (run `trm replay-projections`)
"""

from __future__ import annotations

__all__ = [
    "ConcurrencyError",
    "EventValidationError",
    "ReadOnlyStoreError",
    "SchemaVersionError",
    "StaleProjectionError",
    "StoreError",
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


class ReadOnlyStoreError(StoreError):
    """A write was attempted through a store opened with read_only=True."""


class SchemaVersionError(StoreError):
    """The database schema is not at the head revision this code expects."""


class EventValidationError(StoreError):
    """Event data, meta or type is invalid; raised before anything is written."""


class StaleProjectionError(StoreError):
    """A projection is behind the event log or at another version than the code's."""
