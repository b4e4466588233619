"""How a subscription learns that the log may have grown, without reading it: PostgreSQL's
`LISTEN`/`NOTIFY` (every append notifies in its own transaction, so the notification arrives
after its commit, or never), SQLite's `PRAGMA data_version` (it changes when another connection,
in any process, commits to the file), polled at a short interval.

A wake-up is only a hint to read again: what a subscriber gets is decided by positions, so a
spurious wake-up (another store's append on the same PostgreSQL database) costs one read.

A PostgreSQL connection can die without a word: a NAT, firewall or load balancer that drops an
idle connection's state sends no reset, and TCP's keepalive takes hours to notice. So a
subscriber that has heard nothing for `HEARTBEAT_S` asks the server (`SELECT 1`), and shuts its
socket down if no answer comes within `HEARTBEAT_TIMEOUT_S`, or within `READ_TIMEOUT_S` for a
read of the log: the blocked read then fails as a lost connection's does, and the subscription
raises StoreError.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, closing, contextmanager, nullcontext
from typing import Any, Protocol

from sqlalchemy import Connection

__all__ = [
    "HEARTBEAT_S",
    "HEARTBEAT_TIMEOUT_S",
    "NOTIFY_APPENDED",
    "READ_TIMEOUT_S",
    "SQLITE_POLL_S",
    "Wakeups",
    "wakeups",
]

CHANNEL = "trm_events"
NOTIFY_APPENDED = f"pg_notify('{CHANNEL}', '')"
"""Called in every append's transaction on PostgreSQL (`trm_store.postgres`), in the statement
that takes the writer lock."""

SQLITE_POLL_S = 0.02
"""How often a SQLite subscriber checks `data_version`: one cheap pragma, no read of the log."""
HEARTBEAT_S = 10.0
"""How long a PostgreSQL subscriber hears nothing before it asks the server whether it is there."""
HEARTBEAT_TIMEOUT_S = 10.0
"""How long it waits for the answer before taking the connection for lost."""
READ_TIMEOUT_S = 60.0
"""How long a subscriber's read of a batch may go unanswered before its connection is taken for
lost (a batch is at most the store's batch size of events: seconds at worst)."""


class Wakeups(Protocol):
    """Waits for a sign that another connection committed."""

    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds; True when something may have been committed."""

    def answered(self) -> AbstractContextManager[None]:
        """Bounds the subscriber's read in the block: on PostgreSQL, a connection that has
        not answered within `READ_TIMEOUT_S` is taken for lost (see the module)."""


class _DataVersion:
    """SQLite: `PRAGMA data_version` of the subscriber's own connection (which never writes)."""

    def __init__(self, conn: Connection) -> None:
        dbapi_connection = conn.connection.dbapi_connection
        assert dbapi_connection is not None, "the connection was invalidated"
        self._dbapi_connection: Any = dbapi_connection
        self._version = self._read()

    def _read(self) -> int:
        # Outside any transaction (isolation_level None: no implicit BEGIN), so it sees commits.
        return int(self._dbapi_connection.execute("PRAGMA data_version").fetchone()[0])

    def answered(self) -> AbstractContextManager[None]:
        return nullcontext()  # a local file: no path to go silent

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            version = self._read()
            if version != self._version:
                self._version = version
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(SQLITE_POLL_S, left))


class _Notifications:
    """PostgreSQL: `LISTEN` on the subscriber's own connection.

    psycopg keeps notifications that arrive while the subscriber reads (its backlog, returned
    first by the next `notifies()`), so one committed during a read is not lost.
    """

    def __init__(self, conn: Connection) -> None:
        conn.exec_driver_sql(f"LISTEN {CHANNEL}")
        conn.commit()
        dbapi_connection = conn.connection.dbapi_connection
        assert dbapi_connection is not None, "the connection was invalidated"
        self._dbapi_connection: Any = dbapi_connection
        self._heard = time.monotonic()

    def wait(self, timeout: float) -> bool:
        if not self._received(timeout):
            if time.monotonic() - self._heard >= HEARTBEAT_S:
                self._ping()
            return False
        while self._received(0):  # the rest too: one read answers them all
            pass
        self._heard = time.monotonic()
        return True

    def answered(self) -> AbstractContextManager[None]:
        return answered_within(self._dbapi_connection, READ_TIMEOUT_S)

    def _ping(self) -> None:
        """`SELECT 1` (its transaction rolled back: the next read takes a fresh snapshot)."""
        with answered_within(self._dbapi_connection, HEARTBEAT_TIMEOUT_S):
            self._dbapi_connection.execute("SELECT 1").fetchone()
            self._dbapi_connection.rollback()
        self._heard = time.monotonic()

    def _received(self, timeout: float) -> bool:
        # Closed at once: the generator holds the connection's lock until it ends.
        with closing(self._dbapi_connection.notifies(timeout=timeout, stop_after=1)) as notes:
            return next(notes, None) is not None


@contextmanager
def answered_within(dbapi_connection: Any, seconds: float) -> Iterator[None]:
    """The block's calls on `dbapi_connection` (a psycopg one), its socket shut down if they
    have not returned within `seconds`: the blocked read then fails as a lost connection's does
    (psycopg's OperationalError), where a path that stopped forwarding would hold it forever."""
    answered = threading.Event()
    # A descriptor of its own on the connection's socket, taken now: the block may close the
    # connection's (SQLAlchemy invalidates a lost one) and another file may get that number.
    sock = socket.socket(fileno=os.dup(dbapi_connection.fileno()))

    def shut_down() -> None:
        with _shutting:
            if not answered.is_set():
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(seconds, shut_down)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        with _shutting:
            answered.set()
        timer.cancel()
        sock.close()


_shutting = threading.Lock()
"""A block's answer and its timer's shutdown, one at a time: a socket answered in time is never
shut down."""


def wakeups(conn: Connection) -> Wakeups:
    """The wake-ups for `conn`'s database; set up before the subscriber's first read, so every
    commit after that read wakes it."""
    if conn.dialect.name == "postgresql":
        return _Notifications(conn)
    return _DataVersion(conn)
