"""trm_store: an append-only event log with projections, on SQLite or PostgreSQL."""

from trm_store.errors import (
    ConcurrencyError,
    EventValidationError,
    ReadOnlyStoreError,
    SchemaVersionError,
    StaleProjectionError,
    StoreError,
)
from trm_store.events import NewEvent, RecordedEvent, register_event_type
from trm_store.projections import Projection, register_projection
from trm_store.store import Store, open_store

__all__ = [
    "ConcurrencyError",
    "EventValidationError",
    "NewEvent",
    "Projection",
    "ReadOnlyStoreError",
    "RecordedEvent",
    "SchemaVersionError",
    "StaleProjectionError",
    "Store",
    "StoreError",
    "open_store",
    "register_event_type",
    "register_projection",
]
