"""What the store needs from a database, and the choice of backend from a URL.

Each backend (`sqlite`, `postgres`) wraps one database's way to serialise writers, so that global
positions are assigned in commit order and readers following the log never skip an event.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Literal, Protocol

from sqlalchemy import Connection, Engine, Table, make_url
from sqlalchemy.exc import ArgumentError

from trm_store.driver import DriverSql
from trm_store.errors import StoreError
from trm_store.schema import EVENT_COLUMNS

__all__ = ["INSERT_EVENTS", "Backend", "Durability", "create_backend", "normalise_url"]

Durability = Literal["normal", "full"]

INSERT_EVENTS = DriverSql(
    f"INSERT INTO events ({', '.join(EVENT_COLUMNS)}) "
    f"VALUES ({', '.join(':' + name for name in EVENT_COLUMNS)})"
)
"""The event rows of an append, sent straight to the driver with one `executemany`: JSON
already serialised, `recorded_at` through its column type's `bind_processor`."""


class Backend(Protocol):
    """One database: an engine, a serialised write transaction and error translation."""

    engine: Engine
    read_only: bool

    def write_transaction(self) -> AbstractContextManager[Connection]:
        """A transaction that holds the store's single writer lock until it ends."""

    def append_transaction(self) -> AbstractContextManager[Connection]:
        """`write_transaction` for an append, whose statements go to the driver
        (`trm_store.driver`): the backend may skip SQLAlchemy's own transaction bookkeeping."""

    def close(self) -> None:
        """Release every connection (a later transaction opens new ones)."""

    def read_transaction(self, lock: Sequence[Table] = ()) -> AbstractContextManager[Connection]:
        """A transaction that sees one consistent snapshot, in which `lock` (tables a rebuild
        may swap) are read as they were when it began or as the swap left them, never between."""

    def translate(self, error: Exception) -> StoreError | None:
        """The typed error for a driver error this backend understands, else None."""

    def describe(self) -> str:
        """Where the data lives, for messages (never a password)."""


def normalise_url(url: str) -> str:
    """Accept plain `postgresql://` URLs by selecting the psycopg 3 driver we ship with."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def create_backend(url: str, *, read_only: bool, durability: Durability) -> Backend:
    """The backend for `url` (sqlite or postgresql)."""
    if durability not in ("normal", "full"):
        raise StoreError(f"durability must be 'normal' or 'full', got {durability!r}")
    try:
        parsed = make_url(normalise_url(url))
    except ArgumentError as e:
        raise StoreError(f"not a database URL: {e}") from e
    if parsed.get_backend_name() == "sqlite":
        from trm_store.sqlite import SqliteBackend

        return SqliteBackend(parsed, read_only=read_only, durability=durability)
    if parsed.get_backend_name() == "postgresql":
        from trm_store.postgres import PostgresBackend

        return PostgresBackend(parsed, read_only=read_only)
    raise StoreError(
        f"unsupported database {parsed.get_backend_name()!r}: use sqlite or postgresql"
    )
