"""The writers' connections of a PostgreSQL store: kept open between appends, each transaction
begun in the round trip that takes the append lock.

An append used to pay two round trips before its first statement: the pool's pre-ping
(`SELECT 1` at checkout) and psycopg's `BEGIN`, which it sends alone before the first statement
of a transaction. On loopback here a round trip costs ~150 us, a tenth of an append. So writers
keep up to `slots` connections of their own (detached from the pool, which stays the readers'),
in autocommit mode at the driver, and begin each transaction themselves with
`BEGIN ISOLATION LEVEL READ COMMITTED; <first statements>` sent as one simple query (no
parameters, so psycopg sends the text as it is, and PostgreSQL runs them all; values are quoted
into it by psycopg's client-side binding, `ClientCursor.mogrify`). Its result is the last
statement's rows that returned any (`LastRowsCursor`), so an append takes the lock and reads
the heads in one round trip: PostgreSQL takes a new snapshot for each statement of a simple
query at READ COMMITTED (forced, whatever the session's default), so a statement after the lock
sees every append committed before the lock was granted. From there the transaction is an
ordinary one: psycopg sees the server's transaction status, so SQLAlchemy's `commit`/`rollback`
send `COMMIT`/`ROLLBACK`. A transaction can also end in a second query that carries its last
statements and its `COMMIT` (`in_two`, `trm_store.postgres_append`).

No ping: a kept connection that died while idle (a server restart, `pg_terminate_backend`) fails
at that first statement, before anything was written, and the transaction is begun again once on
a fresh connection. A fresh connection that fails is an error for the caller, as before.

A forked child never uses its parent's connections (their sockets are shared, and two processes
talking on one connection corrupt it): an at-fork hook makes every store's writers forget theirs,
unclosed, and gives the engine a new pool (`Engine.dispose(close=False)`, as SQLAlchemy advises
for a child), so the child's readers open their own connections too.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import PoolProxiedConnection

from trm_store.errors import StoreError
from trm_store.postgres_connection import close_now, driver_connection, last_rows
from trm_store.postgres_prepared import (
    NO_SUCH_PREPARED_STATEMENT,
    Prepared,
    ensure_prepared,
    unsure,
)

__all__ = ["LAST_QUERY_HIDDEN", "PostgresWriters", "TransactionAborted"]

_OPENED_AFTER = "trm_opened_after_closes"
"""The key, in a writer connection's `info`, of the `close` count it was opened under."""
LAST_QUERY_HIDDEN = (
    "-- the last query of a transaction in two (PostgresWriters.in_two): its text is not kept"
)
"""The statement of the error raised when a connection is lost once that query left (its
outcome unknown), in place of the query's text."""
_MAY_HAVE_COMMITTED = (
    "the transaction's last query, with its COMMIT, had left: it may have been written"
)
_ABORTED = (
    "a statement of the transaction failed and its error was caught (by a projection's apply?):"
    " PostgreSQL ends such a transaction, and would answer its COMMIT with a rollback; nothing"
    " was written"
)
"""A `COMMIT` of an aborted transaction is no error to psycopg: an append whose projection
swallowed a database error would be acknowledged and lost (review, nineteenth session)."""


class TransactionAborted(Exception):
    """The cause of the StoreError `_ABORTED`: not a failure of the transaction itself but of a
    statement in it, which one append of a group may have caused (its projection's), so the
    group's appends are then written one by one (`trm_store.append`), each to its own outcome."""


_inherited: list[PoolProxiedConnection] = []
"""A forked child's references to its parent's connections: never closed, never used."""


class PostgresWriters:
    """Up to `slots` writer connections of one engine, each used by one transaction at a time."""

    def __init__(self, engine: Engine, slots: int) -> None:
        self._engine = engine
        self._size = slots
        self._slots = threading.BoundedSemaphore(slots)
        self._lock = threading.Lock()
        self._idle: list[PoolProxiedConnection] = []
        self._closes = 0
        """How many times `close` ran: a connection opened before the last one is not kept."""
        _ALL.add(self)

    @contextmanager
    def transaction(
        self,
        first: str,
        params: Mapping[str, Any] | None = None,
        *,
        prepare: Sequence[Prepared] = (),
    ) -> Iterator[tuple[Connection, Sequence[Sequence[Any]]]]:
        """A READ COMMITTED transaction whose first statements are `first` (`;`-separated SQL,
        with `params` in psycopg's `%(name)s` style), and the rows of the last of them;
        committed when the block ends, rolled back if it raises. `prepare` (statements that
        `first` executes) are prepared first on a connection whose session does not have
        them."""
        with self._connection(first, params, prepare) as (conn, connection, raw, rows, _):
            try:
                yield conn, rows
                if raw.info.transaction_status == TransactionStatus.INERROR:
                    raise StoreError(_ABORTED) from TransactionAborted()
                conn.commit()
            except BaseException:
                # It fails if the statement is still running (an exception raised by a signal
                # handler: psycopg cancels only on KeyboardInterrupt and SystemExit); the
                # connection is closed when put back, which ends the transaction and its lock.
                _roll_back(conn, connection)
                raise

    def in_two(
        self,
        first: str,
        last: str,
        params: Mapping[str, Any],
        *,
        prepare: Sequence[Prepared] = (),
    ) -> Sequence[Sequence[Any]] | None:
        """A READ COMMITTED transaction in two round trips: `BEGIN` and `first` (`transaction`'s),
        then `last` (quoted with `params`) and `COMMIT` in one query; the rows of the last
        statement of `last` that returned any. None when `last` failed with nothing written (the
        transaction rolled back; the connection is kept).

        Whatever `first` waits for (the lock), the `COMMIT` is not on its way: a caller gone
        meanwhile (interrupted, killed) leaves a transaction the server rolls back. Once `last`
        has left, a lost connection leaves its outcome unknown, as a `COMMIT`'s is: that error
        is the caller's, and so is an interrupt's (a note on it says so). An error keeps no copy
        of `last`'s text (it holds every value sent).
        """
        then = (f"{last}; COMMIT", params)
        with self._connection(first, None, prepare, then) as (conn, connection, raw, _, sql):
            try:
                rows = last_rows(conn, raw, sql)
                conn.commit()  # nothing to send: SQLAlchemy's transaction ends with the server's
                return rows
            except BaseException as e:
                if isinstance(e, DBAPIError):
                    e.statement = LAST_QUERY_HIDDEN
                else:  # an interrupt (a signal handler's exception): the COMMIT may have left
                    e.add_note(_MAY_HAVE_COMMITTED)
                _roll_back(conn, connection)
                if isinstance(e, DBAPIError) and not e.connection_invalidated:
                    return None
                raise

    @contextmanager
    def _connection(
        self,
        first: str,
        params: Mapping[str, Any] | None,
        prepare: Sequence[Prepared],
        then: tuple[str, Mapping[str, Any]] | None = None,
    ) -> Iterator[
        tuple[
            Connection,
            PoolProxiedConnection,
            psycopg.Connection[Any],
            Sequence[Sequence[Any]],
            str,
        ]
    ]:
        """A slot's connection (SQLAlchemy's, the pool's proxy and the driver's), its transaction
        begun with `first`, the rows of its last statement that returned any, and the query
        `then` (SQL, params) quoted, "" without one; put back (or closed) when the block ends."""
        with self._slots:
            conn, connection, rows, then_sql = self._begun(first, params, prepare, then)
            raw = driver_connection(connection)  # an invalidation forgets it: still to close
            try:
                yield conn, connection, raw, rows, then_sql
            finally:
                self._put_back(conn, connection, raw)

    def _begun(
        self,
        first: str,
        params: Mapping[str, Any] | None,
        prepare: Sequence[Prepared],
        then: tuple[str, Mapping[str, Any]] | None,
    ) -> tuple[Connection, PoolProxiedConnection, Sequence[Sequence[Any]], str]:
        kept = self._take()
        if kept is not None:
            try:
                return self._begin(kept, first, params, prepare, then)
            except DBAPIError as e:
                lost = getattr(e.orig, "sqlstate", None) == NO_SUCH_PREPARED_STATEMENT
                if not (e.connection_invalidated or lost):
                    raise
                # It had died while idle, or its session lost the prepared statement (a
                # `DEALLOCATE`): nothing was written, and `_begin` closed it. Again, on a new one.
        return self._begin(self._opened(), first, params, prepare, then)

    def _begin(
        self,
        connection: PoolProxiedConnection,
        first: str,
        params: Mapping[str, Any] | None,
        prepare: Sequence[Prepared],
        then: tuple[str, Mapping[str, Any]] | None,
    ) -> tuple[Connection, PoolProxiedConnection, Sequence[Sequence[Any]], str]:
        # A new `Connection` per transaction: it reads the engine's echo and logging as they
        # are now, as one from the pool would.
        raw = driver_connection(connection)
        conn = Connection(self._engine, connection)
        # READ COMMITTED whatever the session's default: each statement after the lock's then
        # reads with a snapshot taken once the lock is held.
        sql = f"BEGIN ISOLATION LEVEL READ COMMITTED; {first}"
        try:
            if params is not None:
                sql = psycopg.ClientCursor(raw).mogrify(sql, params)
            # Quoted before `first` waits for the append lock, not while it is held:
            then_sql = "" if then is None else psycopg.ClientCursor(raw).mogrify(*then)
            conn.begin()
            for statement in prepare:
                ensure_prepared(conn, connection, statement)
            rows = last_rows(conn, raw, sql)
        except BaseException:
            close_now(raw)
            raise
        return conn, connection, rows, then_sql

    def _take(self) -> PoolProxiedConnection | None:
        with self._lock:
            return self._idle.pop() if self._idle else None

    def _opened(self) -> PoolProxiedConnection:
        """A new connection, through the pool (so its connect hooks and events run), detached."""
        conn = self._engine.connect()
        conn.execution_options(isolation_level="AUTOCOMMIT")  # before detaching: it needs a pool
        connection = conn.connection
        connection.detach()
        connection.info[_OPENED_AFTER] = self._closes
        return connection

    def _put_back(
        self, conn: Connection, connection: PoolProxiedConnection, raw: psycopg.Connection[Any]
    ) -> None:
        """Keep the connection only if it is alive and out of any transaction; otherwise close
        the driver's connection itself. Not through SQLAlchemy: an invalidated detached
        connection is forgotten unclosed (its session, and any lock, would live until the
        garbage collector ran), and one whose reset fails is left open."""
        clean = (
            not conn.invalidated
            and not raw.closed
            and raw.info.transaction_status == TransactionStatus.IDLE
        )
        with self._lock:
            if clean and connection.info[_OPENED_AFTER] == self._closes:
                self._idle.append(connection)
                return
        close_now(raw)

    def close(self) -> None:
        """Close the idle connections now, and one in use when its transaction ends (a write
        after `close` opens a new one)."""
        with self._lock:
            self._closes += 1
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def forget_after_fork(self) -> None:
        """In a forked child: none of the parent's connections, and fresh locks (a parent's
        thread that held a slot at the fork does not exist here)."""
        _inherited.extend(self._idle)
        self._idle = []
        self._slots = threading.BoundedSemaphore(self._size)
        self._lock = threading.Lock()
        self._engine.dispose(close=False)


def _roll_back(conn: Connection, connection: PoolProxiedConnection) -> None:
    """End a failed transaction (it may fail: the connection is closed when put back)."""
    unsure(connection)  # psycopg's rollback may deallocate them all
    with suppress(Exception):
        conn.rollback()


_ALL: weakref.WeakSet[PostgresWriters] = weakref.WeakSet()
"""Every store's writers in this process, for the at-fork hook."""


def _forget_in_child() -> None:
    for writers in list(_ALL):
        writers.forget_after_fork()


os.register_at_fork(after_in_child=_forget_in_child)
