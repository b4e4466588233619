"""The connections a PostgreSQL store's writers keep between their transactions
(`trm_store.postgres_writers`): opened through the pool and detached from it, kept only when
clean, closed by `close`, and forgotten, unclosed, in a forked child (whose parent still uses
them)."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, Engine
from sqlalchemy.pool import PoolProxiedConnection

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

    def take(self) -> PoolProxiedConnection | None:
        """The connection put back last, if any (the one most likely still warm)."""
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
        clean = (
            not conn.invalidated
            and not raw.closed
            and raw.info.transaction_status == TransactionStatus.IDLE
        )
        with self._lock:
            if clean and connection.info[_OPENED_AFTER] == self._closes:
                used(connection)
                self._idle.append(connection)
                return
        close_now(raw)

    def close(self) -> None:
        """Close the idle connections now; one in use is closed when put back."""
        with self._lock:
            self._closes += 1
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def forget_after_fork(self) -> None:
        """In a forked child: none of the parent's connections, a fresh lock, and a new pool
        for the engine (`Engine.dispose(close=False)`, as SQLAlchemy advises for a child)."""
        _inherited.extend(self._idle)
        self._idle = []
        self._lock = threading.Lock()
        self._engine.dispose(close=False)
