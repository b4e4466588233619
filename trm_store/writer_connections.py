"""One long-lived connection per writing thread, for the SQLite backend's write transactions.

Checking a connection out of the pool and building a new SQLAlchemy `Connection` for every append
costs about 80 us (measured), half as much as the append's own SQLite work: each writing thread
keeps one connection instead. An idle connection outside a transaction holds no lock and no
snapshot in WAL mode, so keeping it costs other processes nothing.

A writer's connection is detached from the engine's pool as soon as it is opened: the pool is the
readers', and writers that are alive but idle must never hold its slots (100 such threads would
make every read wait for the pool's timeout). It is opened through the pool all the same, so it
gets the engine's connect hooks and events. Its thread keeps it, in thread-local storage, next to
a `_Lease` that closes it when Python drops the thread's locals: when the thread ends (or the
store is garbage), with no other thread having to write first.

`close` never closes a connection under a write in flight on another thread (CPython's sqlite3
crashes with SIGSEGV if it does): each connection carries a lock (`IN_USE`, in its `info`) that
its thread holds from `BEGIN` to the transaction's end, and `close` takes it before closing.

A forked child never uses or closes its parent's connections (SQLite handles must not cross a
fork); it opens its own. Forks are counted by an `os.register_at_fork` hook, which every fork made
by Python (`os.fork`, multiprocessing) runs; a lease checks the pid instead, because a child drops
the other threads' locals before that hook has run.
"""

from __future__ import annotations

import os
import threading

from sqlalchemy import Connection, Engine

__all__ = ["CLOSE_AFTER", "IN_USE", "WriterConnections"]

IN_USE = "trm_in_use"
"""The key, in a writer connection's `info`, of the lock its thread holds while it writes."""

CLOSE_AFTER = "trm_close_after"
"""Set, in a writer connection's `info`, by a `close` made on the thread writing on it (a
signal handler's, or a projection's): the write ends first, then closes it. Closed under the
write, the connection would roll its transaction back while the write was told it was written."""

_forks = 0
"""How many times this process's line has forked: a child sees one more than its parent saw."""

_inherited: list[Connection] = []
"""Connections opened before a fork, in the child: kept referenced so nothing ever closes them."""


def _count_fork() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_count_fork)


class _Lease:
    """Owns one thread's writer connection: closes it when dropped, with the thread's locals."""

    __slots__ = ("_conn", "_open", "_pid")
    _getpid = staticmethod(os.getpid)
    _kept = _inherited
    """Held by the class, which outlives the module's globals at interpreter exit."""

    def __init__(self, conn: Connection, open_connections: set[Connection]) -> None:
        open_connections.add(conn)  # first: an interrupt after it leaves it `close`'s to close
        self._conn, self._open, self._pid = conn, open_connections, os.getpid()

    def __del__(self) -> None:
        # No lock: this runs in whichever thread drops the lease, even inside a garbage
        # collection there; whoever takes the connection out of `_open` closes it, once.
        try:
            pid = self._pid
        except AttributeError:  # an interrupt cut `__init__` short: `close` closes it
            return
        if self._getpid() != pid:
            self._kept.append(self._conn)  # a forked child's: the parent's, never closed here
            return
        try:
            self._open.remove(self._conn)
        except KeyError:  # `close` closed it already
            return
        self._conn.close()


def _usable(conn: Connection) -> bool:
    """Neither closed nor invalidated by SQLAlchemy (`trm_store.sqlite_transaction` closes
    one it finds invalidated as its write ends; an interrupt may come first)."""
    return not (conn.closed or conn.invalidated)


class WriterConnections:
    """The writing threads' connections of one engine."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._open: set[Connection] = set()
        """The connections of every live lease, for `close`."""
        self._mine = threading.local()
        """This thread's `conn` and the `forks` it was opened under (found without a lock or a
        lookup on every append), and its `lease`."""
        self._forks = _forks
        """The fork count `_open` was filled under."""

    def current(self) -> Connection:
        """This thread's connection, opened on first use (and again after a fork or close)."""
        mine = self._mine
        conn: Connection | None = getattr(mine, "conn", None)
        # Only `closed` looked at, on every append: one invalidated is closed as its write ends.
        if conn is not None and mine.forks == _forks and not conn.closed:
            return conn
        self._forget_the_parents()
        conn = self._engine.connect()
        conn.connection.detach()
        conn.info[IN_USE] = threading.RLock()  # re-entrant: a thread may close its own store
        # Leased before it is named: wherever an interrupt lands, the thread never writes on a
        # connection that `close` would miss (one leased and not named is closed with its
        # lease, or by `close`; one that an interrupt left unleased is closed when collected).
        # The lease it replaces is dropped only once it is named: its `__del__` is Python code,
        # where a signal handler's append would find the replaced connection named, closed,
        # and lease another in turn, dropping (closing) this one.
        replaced = getattr(mine, "lease", None)
        mine.lease = _Lease(conn, self._open)
        mine.conn, mine.forks = conn, _forks
        del replaced
        return conn

    def mine(self) -> Connection | None:
        """This thread's connection, if it has one open."""
        mine = self._mine
        conn: Connection | None = getattr(mine, "conn", None)
        return conn if conn is not None and mine.forks == _forks and _usable(conn) else None

    def close(self) -> None:
        """Close every thread's connection once its write in flight, if any, has ended (each
        thread's next write opens a new one)."""
        self._forget_the_parents()
        while True:
            try:
                conn = self._open.pop()
            except KeyError:
                return
            if not _usable(conn):  # its `info` would revalidate it, onto another connection
                conn.close()
                continue
            in_use = conn.info[IN_USE]
            if in_use._is_owned():  # this thread is writing on it: see CLOSE_AFTER
                conn.info[CLOSE_AFTER] = True
                continue
            with in_use:
                conn.close()

    def _forget_the_parents(self) -> None:
        """In a forked child, keep the parent's connections referenced and never touch them."""
        with self._lock:
            if self._forks != _forks:
                _inherited.extend(self._open)
                self._open.clear()
                self._forks = _forks
