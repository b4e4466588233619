"""What the store needs from a database (`Backend`), and the one translation of its errors into
the store's typed ones.

Each backend (`sqlite`, `postgres`) wraps one database's way to serialise writers, so that global
positions are assigned in commit order and readers following the log never skip an event. Which
backend a URL gets is `trm_store.connect`'s job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Literal, Protocol, TypeVar

from sqlalchemy import Connection, Engine, Table
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from trm_store.append_heads import AppendHeads
from trm_store.errors import StoreError
from trm_store.prepared import PreparedAppend
from trm_store.rebuild_lock import RebuildLock

__all__ = [
    "CALLERS_SQL",
    "AppendServerNumbered",
    "AppendWrite",
    "Backend",
    "Durability",
    "reading",
    "rolled_back",
    "store_error",
    "writing",
]

Durability = Literal["normal", "full"]


T = TypeVar("T")

CALLERS_SQL = "trm_callers_sql"
"""Marks, in a connection's `info`, that a caller's SQL ran on it: its session may hold the
caller's settings until the backend restores them."""

AppendWrite = Callable[[Connection, AppendHeads, Sequence[Sequence[PreparedAppend]]], T]
"""What `Backend.append_transaction` runs in the transaction: given the connection, what it
read under the lock (`trm_store.append_heads`) and the appends."""


class AppendServerNumbered(Protocol):
    """Write appends with the database numbering their events under the lock, the client's
    work all done before the lock is asked for: what a backend offers when an append's round
    trips under the lock are worth saving (PostgreSQL: one instead of three,
    `trm_store.postgres_append`; on SQLite there are none)."""

    def __call__(
        self,
        appends: Sequence[Sequence[PreparedAppend]],
        recorded_at: datetime,
        ours: Mapping[str, int],
    ) -> list[tuple[int, int]] | None:
        """Each event's position and version, in order; None when nothing was written: too
        large an append, a stream not at an append's expected version, an event id taken, or a
        projection's checkpoint row to change (`ours`: the projections this code runs, name ->
        version). The caller never sends it events a projection of `ours` takes, nor ids of
        its callers' choosing."""


class Backend(Protocol):
    """One database: an engine, a serialised write transaction and error translation."""

    engine: Engine
    read_only: bool

    def write_transaction(
        self, conn: Connection | None = None
    ) -> AbstractContextManager[Connection]:
        """A transaction that holds the store's single writer lock until it ends (on `conn`,
        a connection of the caller's own, when given)."""

    def append_transaction(
        self,
        stream_id: str,
        known_epoch: int,
        write: AppendWrite[T],
        appends: Sequence[Sequence[PreparedAppend]],
    ) -> T:
        """`write(conn, heads, appends)` in `write_transaction` for an append, whose statements
        go to the driver (`trm_store.driver`): the backend may skip SQLAlchemy's own transaction
        bookkeeping. `heads` are the log's head, `stream_id`'s version, the projections' epoch
        and, unless it is `known_epoch`, their checkpoint rows, read under the lock
        (`trm_store.append_heads`). A call, not a context manager: the `with` is the backend's
        own, so that its `except` clause sees every interrupt that lands in the transaction's
        end (`trm_store.sqlite_transaction`)."""

    @property
    def append_server_numbered(self) -> AppendServerNumbered | None:
        """Whether appends can be numbered by the database (`AppendServerNumbered`), and how."""

    def rebuild_lock(self, *, wait: bool) -> AbstractContextManager[RebuildLock | None]:
        """Own the store's projection rebuilds for the block (`trm_store.rebuild_lock`): None
        when `wait` is False and a live process holds the lock."""

    def close(self) -> None:
        """Release every connection (a later transaction opens new ones)."""

    def read_transaction(
        self, lock: Sequence[Table] = (), conn: Connection | None = None
    ) -> AbstractContextManager[Connection]:
        """A transaction that sees one consistent snapshot, in which `lock` (tables a rebuild
        may swap) are read as they were when it began or as the swap left them, never between
        (on `conn`, a connection of the caller's own, when given)."""

    def read_statement(self) -> AbstractContextManager[Connection]:
        """A connection for a read of one statement, which sees one snapshot by itself: with
        no transaction where that saves round trips (a writable PostgreSQL store: no `BEGIN`,
        no `COMMIT`)."""

    def translate(self, error: Exception) -> StoreError | None:
        """The typed error for a driver error this backend understands, else None."""

    def describe(self) -> str:
        """Where the data lives, for messages (never a password)."""


def store_error(backend: Backend, error: SQLAlchemyError) -> StoreError:
    """The StoreError for a database error: the backend's typed one, else a plain StoreError
    naming the store (every store method raises these, never SQLAlchemy's own)."""
    typed = backend.translate(error)
    if typed is not None:
        return typed
    detail = error.orig if isinstance(error, DBAPIError) else error
    return StoreError(f"database error on {backend.describe()}: {detail}")


@contextmanager
def reading(
    backend: Backend, lock: Sequence[Table] = (), *, one_statement: bool = False
) -> Iterator[Connection]:
    """`backend.read_transaction(lock)` (`read_statement()` for a read of `one_statement`), its
    database errors raised as StoreErrors."""
    try:
        read = backend.read_statement() if one_statement else backend.read_transaction(lock)
        with read as conn:
            yield conn
    except SQLAlchemyError as e:
        raise store_error(backend, e) from e


def rolled_back(
    conn: Connection, tables: Mapping[str, Table]
) -> Iterator[tuple[Connection, Mapping[str, Table]]]:
    """Yields `(conn, tables)` once, then rolls back what is open: what a read's caller did in
    it, a session setting too, ends with it. The connection is marked first (`CALLERS_SQL`):
    what the caller may have committed (a `COMMIT`, `COMMIT AND CHAIN`, then a `SET`) the
    backend undoes when the connection goes back to its pool (PostgreSQL:
    `trm_store.postgres_session`)."""
    conn.info[CALLERS_SQL] = True
    yield conn, tables
    if not conn.closed and conn.in_transaction():  # an invalidated one too: SQLAlchemy needs it
        conn.rollback()


@contextmanager
def writing(backend: Backend) -> Iterator[Connection]:
    """`backend.write_transaction()`, its database errors raised as StoreErrors."""
    try:
        with backend.write_transaction() as conn:
            yield conn
    except SQLAlchemyError as e:
        raise store_error(backend, e) from e
