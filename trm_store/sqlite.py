"""SQLite backend: WAL, a busy timeout, and `BEGIN IMMEDIATE` for every write transaction.

`BEGIN IMMEDIATE` takes the database's write lock at the start, so concurrent writers queue on the
busy timeout instead of failing with "database is locked" when they upgrade a read lock."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from typing import Any
from urllib.parse import quote

from sqlalchemy import URL, Connection, Engine, Table, create_engine, event
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import DBAPIError

from trm_store.append_heads import heads
from trm_store.backend import AppendStart, Durability
from trm_store.driver import DriverSql, execute
from trm_store.errors import ReadOnlyStoreError, StoreError
from trm_store.json_codec import serialize_json
from trm_store.rebuild_lock import RebuildLock, file_rebuild_lock
from trm_store.sqlite_dialect import register_dialect
from trm_store.sqlite_writer_lock import WriterLock, writer_lock
from trm_store.store_url import check_sqlite_file, sqlite_target
from trm_store.writer_connections import IN_USE, WriterConnections

__all__ = ["SqliteBackend"]

BUSY_TIMEOUT_MS = 60_000
_BEGIN_IMMEDIATE = DriverSql("BEGIN IMMEDIATE")
_COMMIT = DriverSql("COMMIT")
_OURS_OR_EMPTY = (
    "SELECT NOT EXISTS (SELECT 1 FROM sqlite_master WHERE name NOT LIKE 'sqlite%')"
    " OR EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'events')"
)
"""WAL is switched on for a trm store or an empty file only: a foreign database keeps its
journal mode until `open_store(..., adopt_database=True)` has made it a trm store."""
_WAL_RETRY_S = 0.002  # the pause before `_use_wal` tries the switch to WAL again


def _use_wal(cursor: sqlite3.Cursor) -> None:
    """Put the file in WAL mode (kept in the file: a no-op once done), waiting up to the busy
    timeout for it.

    The switch can be refused at once with SQLITE_BUSY, without SQLite's busy handler, when
    processes open a new file together (tests/store/test_sqlite_first_open.py): it asks for the
    write lock inside a read transaction, where SQLite does not wait for another connection's
    write lock (the two could wait for each other). A refused switch is tried again."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if e.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY or left_ms <= 0:
                raise
        # A try may itself wait in the busy handler: no longer than the time left (`_configure`
        # sets the busy timeout again after the switch).
        cursor.execute(f"PRAGMA busy_timeout={left_ms}")
        time.sleep(_WAL_RETRY_S)


_WRITING = "trm_writing"
"""Marks a writer connection (in its `info`) while its write transaction is open."""


def _refuse_attach(action: int, *_args: object) -> int:
    """sqlite3 authorizer for read-only stores: no ATTACH, so nothing can be reopened writable."""
    return sqlite3.SQLITE_DENY if action == sqlite3.SQLITE_ATTACH else sqlite3.SQLITE_OK


def _rollback(conn: Connection, dbapi_connection: DBAPIConnection) -> None:
    """End whatever transaction is open, SQLAlchemy's and SQLite's."""
    if conn.in_transaction():
        conn.rollback()
    if dbapi_connection.in_transaction:
        dbapi_connection.rollback()


def _rollback_quietly(conn: Connection, dbapi_connection: DBAPIConnection) -> None:
    """`_rollback` on the way out of a failed or interrupted transaction: its own failure (a
    connection an interrupt closed) must not replace what is being raised."""
    with suppress(Exception):
        _rollback(conn, dbapi_connection)


class AppendTransaction:
    """`BEGIN IMMEDIATE` ... `COMMIT`, both sent on the driver, on a writer connection, under the
    database's writer lock (`trm_store.sqlite_writer_lock`).

    SQLAlchemy's transaction begins only if the block runs a statement through it (the
    dialect's `do_begin` then finds SQLite's transaction open and adds nothing), and then ends
    with it: an append, which sends only driver statements, skips its bookkeeping. A class, not
    a `contextmanager` generator: it runs for every append, where each Python call counts.
    """

    __slots__ = ("_conn", "_dbapi_connection", "_in_use", "_info", "_writer_lock")
    _dbapi_connection: DBAPIConnection

    def __init__(self, conn: Connection, writer_lock: WriterLock) -> None:
        self._conn = conn
        self._info = info = conn.info
        self._in_use = info.get(IN_USE) or nullcontext()  # a writer connection's: see IN_USE
        self._writer_lock = writer_lock

    def __enter__(self) -> Connection:
        conn, info = self._conn, self._info
        if info.get(_WRITING):
            raise StoreError(
                "write transactions do not nest: this thread's write transaction is still open"
            )
        self._writer_lock.acquire()
        try:
            self._in_use.__enter__()
        except BaseException:
            self._writer_lock.release()
            raise
        dbapi_connection = None
        try:
            if conn.closed:
                raise StoreError("the store was closed while this write began: nothing written")
            dbapi_connection = conn.connection.dbapi_connection
            assert dbapi_connection is not None, "the connection was invalidated"
            self._dbapi_connection = dbapi_connection
            info[_WRITING] = True
            _rollback(conn, dbapi_connection)  # anything an interrupt left open
            execute(conn, _BEGIN_IMMEDIATE, {})
        except BaseException:
            info[_WRITING] = False
            try:
                # After `BEGIN IMMEDIATE`: else this idle connection keeps SQLite's write lock.
                if dbapi_connection is not None:
                    _rollback_quietly(conn, dbapi_connection)
            finally:
                self._let_go()
            raise
        return conn

    def _let_go(self) -> None:
        """The connection, then the writer lock, even if an interrupt lands in between."""
        try:
            self._in_use.__exit__(None, None, None)
        finally:
            self._writer_lock.release()

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        conn, dbapi_connection = self._conn, self._dbapi_connection
        try:
            if kind is not None:
                _rollback_quietly(conn, dbapi_connection)
                return
            try:
                if conn.in_transaction():
                    conn.commit()
                elif dbapi_connection.in_transaction:
                    execute(conn, _COMMIT, {})
            except BaseException:
                _rollback_quietly(conn, dbapi_connection)
                raise
        finally:
            self._info[_WRITING] = False
            self._let_go()


class HeadsRead:
    """An `AppendTransaction` that yields the connection with the log's head, the first
    stream's version and the projections' rows (`trm_store.append_heads`), read once the
    transaction has begun."""

    __slots__ = ("_stream_id", "_transaction")

    def __init__(self, transaction: AppendTransaction, stream_id: str) -> None:
        self._transaction = transaction
        self._stream_id = stream_id

    def __enter__(self) -> AppendStart:
        conn = self._transaction.__enter__()
        try:
            read = heads(conn, self._stream_id)
        except BaseException as e:
            self._transaction.__exit__(type(e), e, e.__traceback__)
            raise
        return conn, read

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: object
    ) -> None:
        self._transaction.__exit__(kind, error, trace)


class SqliteBackend:
    """A SQLite file shared by any number of processes on one machine."""

    append_server_numbered = None  # an append makes no round trip to save

    def __init__(self, url: URL, *, read_only: bool, durability: Durability) -> None:
        target = sqlite_target(url)
        self.path = target.path
        self.read_only = read_only = read_only or target.read_only
        check_sqlite_file(self.path, create=not (read_only or target.must_exist))
        if read_only:  # a URI filename: the path percent-encoded, so '?' or '#' stay in it
            engine_url = URL.create(
                "sqlite+trm",
                database=f"file:{quote(str(self.path))}",
                query={"mode": "ro", "uri": "true"},
            )
        else:
            engine_url = URL.create("sqlite+trm", database=str(self.path))
        register_dialect()
        self.engine: Engine = create_engine(
            engine_url,
            connect_args={"timeout": BUSY_TIMEOUT_MS / 1000},
            json_serializer=serialize_json,
        )
        self._writers = WriterConnections(self.engine)
        self._writer_lock = writer_lock(self.path, BUSY_TIMEOUT_MS / 1000)
        synchronous = "FULL" if durability == "full" else "NORMAL"
        writable = not read_only

        @event.listens_for(self.engine, "connect")
        def _configure(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
            # Transactions begin explicitly: BEGIN IMMEDIATE for writers, BEGIN by the dialect.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            if writable and cursor.execute(_OURS_OR_EMPTY).fetchone()[0]:
                _use_wal(cursor)
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            cursor.close()
            if not writable:
                # mode=ro guards the main file, but raw SQL could ATTACH it again read-write.
                dbapi_connection.set_authorizer(_refuse_attach)

    @contextmanager
    def write_transaction(self, conn: Connection | None = None) -> Iterator[Connection]:
        # SQLAlchemy's transaction begun at once: code that begins its own (alembic) joins it.
        self._refuse_if_read_only()
        transaction = AppendTransaction(conn or self._writers.current(), self._writer_lock)
        with transaction as conn, conn.begin():
            yield conn

    def append_transaction(self, stream_id: str) -> HeadsRead:
        """`BEGIN IMMEDIATE` ... `COMMIT` on this thread's writer connection (see
        `AppendTransaction`), the heads read first."""
        self._refuse_if_read_only()
        return HeadsRead(AppendTransaction(self._writers.current(), self._writer_lock), stream_id)

    def rebuild_lock(self, *, wait: bool) -> AbstractContextManager[RebuildLock | None]:
        self._refuse_if_read_only()
        return file_rebuild_lock(self.path, wait=wait)

    def _refuse_if_read_only(self) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(f"store {self.describe()} was opened read_only=True")

    def close(self) -> None:
        self._writers.close()
        self._writer_lock.close_file()
        self.engine.dispose()

    @contextmanager
    def read_transaction(
        self, lock: Sequence[Table] = (), conn: Connection | None = None
    ) -> Iterator[Connection]:
        """A WAL snapshot, taken at the first read. `lock` needs nothing here: a reader keeps
        the schema and the tables of its snapshot across a rebuild's rename."""
        with (
            nullcontext(conn) if conn is not None else self.engine.connect() as conn,
            conn.begin(),
        ):
            yield conn

    def translate(self, error: Exception) -> StoreError | None:
        """By SQLite's own result code (`sqlite_errorcode`), never by the message's words."""
        if not isinstance(error, DBAPIError):
            return None
        code = getattr(error.orig, "sqlite_errorcode", None)
        if code is None:
            return None
        primary = code & 0xFF  # an extended result code carries its primary one in its low byte
        if primary == sqlite3.SQLITE_READONLY:
            return ReadOnlyStoreError(f"store {self.describe()} is read-only: {error.orig}")
        if primary == sqlite3.SQLITE_FULL:
            return StoreError(f"disk full writing {self.describe()}: nothing was written")
        if primary in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            return StoreError(f"{self.describe()} is corrupt or not a trm store: {error.orig}")
        if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return StoreError(
                f"{self.describe()} stayed locked past the busy timeout: {error.orig}"
            )
        if code == sqlite3.SQLITE_CONSTRAINT_TRIGGER:  # RAISE(ABORT), as the log's triggers do
            return StoreError(f"a trigger refused the write: {error.orig}")
        return None

    def describe(self) -> str:
        return f"sqlite:///{self.path}"
