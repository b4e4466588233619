"""Who owns a store's projection rebuild: a lock that a live owner holds and a dead one loses.

One rebuild at a time per store. The owner is never inferred from the `rebuilding` mark in
`projection_state` (that mark only says a rebuild was asked for and has not finished): it is a
lock the operating system or the database server drops when the owning process dies, however
it dies (SIGKILL included), so the next opener can tell a live rebuild from an interrupted one.

- SQLite: `flock` on a file next to the database (`<file>-rebuild`). The kernel releases it
  when the last descriptor of the owner closes. The database file itself is never locked this
  way: closing any descriptor of it would drop SQLite's own POSIX locks of the process.
- PostgreSQL: a session-level advisory lock on a connection of its own, keyed by the schema, so
  stores in other schemas of one database do not wait for each other. The server releases it
  when the session ends, a dead client's included.
"""

from __future__ import annotations

import fcntl
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from sqlalchemy import Connection, Engine, text

from trm_store.errors import StoreError

__all__ = ["RebuildLock", "advisory_key", "advisory_rebuild_lock", "file_rebuild_lock"]

REBUILD_LOCK_NAMESPACE = 0x74726D  # "trm"; with a second key: another key space than appends'


class RebuildLock(Protocol):
    """A held rebuild lock."""

    def confirm(self, conn: Connection) -> None:
        """Raise StoreError unless the lock is still held, checked in the transaction that
        swaps a rebuild in: nothing the owner built is swapped in after it lost the lock."""


class _FileLock:
    def confirm(self, conn: Connection) -> None:
        """A held `flock` is lost only with its descriptor, which the block keeps open."""


@contextmanager
def file_rebuild_lock(database: Path, *, wait: bool) -> Iterator[RebuildLock | None]:
    """Hold the rebuild lock of the SQLite store at `database` for the block (None when `wait`
    is False and a live process holds it)."""
    path = f"{database}-rebuild"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise StoreError(f"cannot open the rebuild lock {path}: {e.strerror}") from e
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        try:
            yield _FileLock()
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def advisory_key(schema: str) -> int:
    """The second key of the rebuild lock of the store in `schema` (a non-negative int4)."""
    return zlib.crc32(schema.encode()) & 0x7FFFFFFF


_HOLDS = text(
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND classid = :k1 AND objid = :k2 AND objsubid = 2 AND pid = :pid"
)


class _AdvisoryLock:
    def __init__(self, key: int, pid: int) -> None:
        self._params = {"k1": REBUILD_LOCK_NAMESPACE, "k2": key, "pid": pid}

    def confirm(self, conn: Connection) -> None:
        """The owner's session still holds the lock (it would have lost it with the session)."""
        if conn.execute(_HOLDS, self._params).scalar_one() != 1:
            raise StoreError(
                "this rebuild lost its lock (its database session ended): not swapped in"
            )


@contextmanager
def advisory_rebuild_lock(engine: Engine, *, wait: bool) -> Iterator[RebuildLock | None]:
    """Hold the rebuild lock of the PostgreSQL store of `engine` for the block (None when `wait`
    is False and a live session holds it), on a connection kept out of the pool meanwhile."""
    conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        schema, pid = conn.execute(text("SELECT current_schema(), pg_backend_pid()")).one()
        key = advisory_key(schema or "")  # no schema: no tables either, any key will do
        params = {"k1": REBUILD_LOCK_NAMESPACE, "k2": key}
        if wait:
            conn.execute(text("SELECT pg_advisory_lock(:k1, :k2)"), params)
        elif not conn.execute(text("SELECT pg_try_advisory_lock(:k1, :k2)"), params).scalar():
            yield None
            return
        yield _AdvisoryLock(key, pid)
        conn.execute(text("SELECT pg_advisory_unlock(:k1, :k2)"), params)
    except BaseException:
        conn.invalidate()  # the session ends, and the server drops whatever it held
        raise
    finally:
        conn.close()
