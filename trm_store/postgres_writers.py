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
send `COMMIT`/`ROLLBACK`. A transaction can also carry its last statements and its `COMMIT` in
that same query, or in a second one on a connection that is not warm (`committed`,
`trm_store.postgres_append`, `trm_store.postgres_warm`).

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
from trm_store.postgres_kept import KeptConnections
from trm_store.postgres_outcome import MAY_HAVE_COMMITTED, final, hide_or_note, sent
from trm_store.postgres_prepared import (
    NO_SUCH_PREPARED_STATEMENT,
    Prepared,
    ensure_prepared,
    unsure,
)
from trm_store.postgres_session import callers_sql_ran, restored, restoring
from trm_store.postgres_warm import cancel_running, warm

__all__ = ["PostgresWriters", "TransactionAborted"]

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


class PostgresWriters:
    """Up to `slots` writer connections of one engine, each used by one transaction at a time."""

    def __init__(self, engine: Engine, slots: int) -> None:
        self._engine = engine
        self._size = slots
        self._slots = threading.BoundedSemaphore(slots)
        self._kept = KeptConnections(engine)
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
            callers_sql_ran(connection)  # the block's (`trm_store.postgres_session`)
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

    def committed(
        self,
        first: str,
        last: str,
        params: Mapping[str, Any],
        *,
        prepare: Sequence[Prepared] = (),
    ) -> Sequence[Sequence[Any]] | None:
        """A READ COMMITTED transaction of `first`, then `last` (quoted with `params`) and
        `COMMIT`: all in one query on a connection that may carry it (`trm_store.postgres_warm`),
        else in two round trips (`BEGIN` and `first`, as `transaction`'s, then the rest). The
        rows of the last statement of `last` that returned any; None when the transaction failed
        with nothing written (rolled back).

        In two, whatever `first` waits for (the lock), the `COMMIT` is not on its way: a caller
        gone meanwhile leaves a transaction the server rolls back. In one, the server sees a
        killed caller's socket closed within `CLIENT_CHECK_MS`, and an interrupted caller
        cancels. Once the `COMMIT` has left, a lost connection leaves the outcome unknown: that
        error is the caller's, and so is an interrupt's (a note on it says so). An error keeps
        no copy of `last`'s text (it holds every value sent).
        """
        then = (f"{last}; COMMIT", params)
        answered = False
        try:
            with self._connection(first, None, prepare, then) as (conn, connection, raw, rows, sql):
                answered = True
                return self._then(conn, connection, raw, rows, sql)
        except DBAPIError as e:
            if not sent(e) or e.connection_invalidated or final(e):
                raise
            return None  # the server's error for the query with the COMMIT: it rolled back
        except BaseException as e:  # an interrupt once the first query answered (the whole one?)
            if answered and MAY_HAVE_COMMITTED not in getattr(e, "__notes__", ()):
                e.add_note(MAY_HAVE_COMMITTED)
            raise

    def _then(
        self,
        conn: Connection,
        connection: PoolProxiedConnection,
        raw: psycopg.Connection[Any],
        rows: Sequence[Sequence[Any]],
        sql: str,
    ) -> Sequence[Sequence[Any]]:
        """`committed`'s second query, `sql`, unless the first carried it (""); its error is
        marked sent (`hide_or_note`) for `committed` to read, the transaction rolled back."""
        if sql:
            try:
                rows = last_rows(conn, raw, sql)
            except BaseException as e:
                hide_or_note(e)
                _roll_back(conn, connection)
                raise
        conn.commit()  # nothing to send: SQLAlchemy's transaction ends with the server's
        restored(connection)
        return rows

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
        `then` (SQL, params) quoted: "" without one, or when `first`'s query carried it (then
        the rows are its); put back (or closed) when the block ends."""
        with self._slots:
            conn, connection, rows, then_sql = self._begun(first, params, prepare, then)
            raw = driver_connection(connection)  # an invalidation forgets it: still to close
            try:
                yield conn, connection, raw, rows, then_sql
            finally:
                self._kept.put_back(conn, connection, raw)

    def _begun(
        self,
        first: str,
        params: Mapping[str, Any] | None,
        prepare: Sequence[Prepared],
        then: tuple[str, Mapping[str, Any]] | None,
    ) -> tuple[Connection, PoolProxiedConnection, Sequence[Sequence[Any]], str]:
        kept = self._kept.take()
        if kept is not None:
            whole = then is not None and warm(kept, driver_connection(kept), fresh=False)
            try:
                return self._begin(kept, first, params, prepare, then, whole=whole)
            except DBAPIError as e:
                lost = getattr(e.orig, "sqlstate", None) == NO_SUCH_PREPARED_STATEMENT
                if not (e.connection_invalidated or lost) or (sent(e) and not lost):
                    raise  # a whole query that may have committed, lost: its outcome is unknown
                # It had died while idle, or its session lost the prepared statement (a
                # `DEALLOCATE`): nothing was written, and `_begin` closed it. Again, on a new one.
        fresh = self._kept.opened()
        whole = then is not None and warm(fresh, driver_connection(fresh), fresh=True)
        return self._begin(fresh, first, params, prepare, then, whole=whole)

    def _begin(
        self,
        connection: PoolProxiedConnection,
        first: str,
        params: Mapping[str, Any] | None,
        prepare: Sequence[Prepared],
        then: tuple[str, Mapping[str, Any]] | None,
        *,
        whole: bool,
    ) -> tuple[Connection, PoolProxiedConnection, Sequence[Sequence[Any]], str]:
        """Begin with `first`; with `then` too when `whole` (`then` then returns as "")."""
        # A new `Connection` per transaction: it reads the engine's echo and logging as they
        # are now, as one from the pool would.
        raw = driver_connection(connection)
        conn = Connection(self._engine, connection)
        left = False
        try:
            conn.begin()
            # READ COMMITTED whatever the session's default: each statement after the lock's
            # then reads with a snapshot taken once the lock is held. After a caller's SQL, the
            # session's settings first (a `search_path` it set would send this transaction to
            # another schema's log).
            restore = restoring(conn, connection, prepare)
            sql = f"BEGIN ISOLATION LEVEL READ COMMITTED; {restore}{first}"
            if params is not None:
                sql = psycopg.ClientCursor(raw).mogrify(sql, params)
            # Quoted before `first` waits for the append lock, not while it is held:
            then_sql = "" if then is None else psycopg.ClientCursor(raw).mogrify(*then)
            if whole:
                sql, then_sql = f"{sql}; {then_sql}", ""
            for statement in prepare:
                ensure_prepared(conn, connection, statement)
            left = whole  # from here on, a whole query's outcome is unknown until it answers
            rows = last_rows(conn, raw, sql)
        except BaseException as e:
            try:
                if left:
                    hide_or_note(e)
                    cancel_running(raw)
            finally:  # even if a second interrupt cuts the cancel short
                close_now(raw)
            raise
        return conn, connection, rows, then_sql

    def close(self) -> None:
        """Close the idle connections now, and one in use when its transaction ends (a write
        after `close` opens a new one)."""
        self._kept.close()

    def forget_after_fork(self) -> None:
        """In a forked child: none of the parent's connections, and fresh locks (a parent's
        thread that held a slot at the fork does not exist here)."""
        self._slots = threading.BoundedSemaphore(self._size)
        self._kept.forget_after_fork()


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
