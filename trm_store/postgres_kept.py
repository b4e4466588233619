"""The connections a PostgreSQL store's writers keep between their transactions
(`trm_store.postgres_writers`): opened through the pool and detached from it, kept only when
clean, closed by `close`, and let go in a forked child, whose parent still uses them.

In the child, the socket of every connection the parent's engine opened (a writer's, idle or in
a transaction, or a reader's in the pool, which the writers may take later) is replaced by
`/dev/null` under the same descriptor, unclosed at the protocol level: the child cannot talk on
it (two processes on one connection corrupt it), and does not keep it open. A socket the child
kept open would outlive the parent: the server, which watches for a closed socket to end the
query of a writer that died while it waited for the lock (`trm_store.postgres_warm`), would see
none, and commit a dead writer's append (review, twenty-seventh session). Connections are
counted from the engine's first `connect` listener; a fork from another thread inside psycopg's
own connect, before that listener runs, leaves that one socket open in the child.

The child forgets the parent's connections at its first use of the writers too, should a fork
hook of the application's, registered before trm's, write before trm's hook has run."""

from __future__ import annotations

import os
import threading
import weakref
from contextlib import suppress
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, Engine, event
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection

from trm_store.postgres_connection import close_now, driver_connection
from trm_store.postgres_warm import used, watch_client

__all__ = ["KeptConnections"]

_OPENED_AFTER = "trm_opened_after_closes"
"""The key, in a writer connection's `info`, of the `close` count it was opened under."""

_inherited: list[PoolProxiedConnection] = []
"""A forked child's references to its parent's connections: never closed, never used."""


class KeptConnections:
    """One engine's writer connections that are idle, and how new ones are opened."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._idle: list[PoolProxiedConnection] = []
        self._closes = 0
        """How many times `close` ran: a connection opened before the last one is not kept."""
        self._pid = os.getpid()
        self._opened: weakref.WeakKeyDictionary[psycopg.Connection[Any], int] = (
            weakref.WeakKeyDictionary()
        )
        """Every connection the engine opened and not yet garbage, and the process that opened
        it: the ones a forked child lets go."""
        event.listen(engine, "connect", self._count, insert=True)

    def _count(self, dbapi_connection: Any, _record: ConnectionPoolEntry) -> None:
        self._opened[dbapi_connection] = os.getpid()

    def take(self) -> PoolProxiedConnection | None:
        """The connection put back last, if any (the one most likely still warm)."""
        if self._pid != os.getpid():  # a fork hook wrote before trm's ran
            self.forget_after_fork()
        with self._lock:
            return self._idle.pop() if self._idle else None

    def opened(self) -> PoolProxiedConnection:
        """A new connection, through the pool (so its connect hooks and events run), detached,
        in autocommit at the driver, its client watched by the server (`watch_client`)."""
        conn = self._engine.connect()
        conn.execution_options(isolation_level="AUTOCOMMIT")  # before detaching: it needs a pool
        connection = conn.connection
        connection.detach()
        connection.info[_OPENED_AFTER] = self._closes
        try:
            watch_client(connection, driver_connection(connection))
        except BaseException:
            close_now(driver_connection(connection))
            raise
        return connection

    def put_back(
        self, conn: Connection, connection: PoolProxiedConnection, raw: psycopg.Connection[Any]
    ) -> None:
        """Keep the connection only if it is alive and out of any transaction; otherwise close
        the driver's connection itself. Not through SQLAlchemy: an invalidated detached
        connection is forgotten unclosed (its session, and any lock, would live until the
        garbage collector ran), and one whose reset fails is left open."""
        kept = False
        try:
            clean = (
                not conn.invalidated
                and not raw.closed
                and raw.info.transaction_status == TransactionStatus.IDLE
            )
            with self._lock:
                if clean and connection.info[_OPENED_AFTER] == self._closes:
                    used(connection)
                    self._idle.append(connection)
                    kept = True
        finally:  # an interrupt here must not leak it
            if not kept:
                close_now(raw)

    def close(self) -> None:
        """Close the idle connections now; one in use is closed when put back."""
        with self._lock:
            self._closes += 1
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def forget_after_fork(self) -> None:
        """In a forked child: none of the parent's connections, their sockets let go, a fresh
        lock, and a new pool for the engine (`Engine.dispose(close=False)`, as SQLAlchemy
        advises for a child). Once per process."""
        here = os.getpid()
        if self._pid == here:
            return
        self._pid = here
        _inherited.extend(self._idle)
        self._idle = []
        self._lock = threading.Lock()
        nothing = os.open(os.devnull, os.O_RDWR)
        try:
            for raw, opener in list(self._opened.items()):
                with suppress(Exception):  # a closed one has no descriptor left
                    if opener != here and not raw.closed:
                        os.dup2(nothing, raw.fileno(), inheritable=False)
        finally:
            os.close(nothing)
        self._engine.dispose(close=False)
