"""SQLite backend: WAL, a busy timeout, and `BEGIN IMMEDIATE` for every write transaction.

`BEGIN IMMEDIATE` takes the database's write lock at the start, so concurrent writers queue on the
busy timeout instead of failing with "database is locked" when they upgrade a read lock."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar
from urllib.parse import quote

from sqlalchemy import URL, Connection, Engine, Table, create_engine, event
from sqlalchemy.exc import DBAPIError

from trm_store.append_heads import heads
from trm_store.backend import AppendWrite, Durability
from trm_store.errors import ReadOnlyStoreError, StoreError
from trm_store.json_codec import serialize_json
from trm_store.prepared import PreparedAppend
from trm_store.rebuild_lock import RebuildLock, file_rebuild_lock
from trm_store.sqlite_dialect import register_dialect
from trm_store.sqlite_transaction import AppendTransaction, finish_cut_short
from trm_store.sqlite_writer_lock import writer_lock
from trm_store.store_url import check_sqlite_file, sqlite_target
from trm_store.wal_sync import WAL_SYNCED, WalSync
from trm_store.writer_connections import WriterConnections

__all__ = ["SqliteBackend"]

T = TypeVar("T")

BUSY_TIMEOUT_MS = 60_000
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


def _refuse_attach(action: int, *_args: object) -> int:
    """sqlite3 authorizer for read-only stores: no ATTACH, so nothing can be reopened writable."""
    return sqlite3.SQLITE_DENY if action == sqlite3.SQLITE_ATTACH else sqlite3.SQLITE_OK


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
        writable = not read_only
        sync = self._wal_sync = (
            WalSync(self.describe()) if durability == "full" and writable else None
        )

        @event.listens_for(self.engine, "connect")
        def _configure(dbapi_connection: sqlite3.Connection, record: Any) -> None:
            # Transactions begin explicitly: BEGIN IMMEDIATE for writers, BEGIN by the dialect.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            if writable and cursor.execute(_OURS_OR_EMPTY).fetchone()[0]:
                _use_wal(cursor)
            synchronous = "FULL" if durability == "full" else "NORMAL"
            if (
                sync is not None
                and cursor.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
                and sync.watch(cursor)
            ):
                # Commits synced once the writer lock is let go (`trm_store.wal_sync`); a
                # foreign file's other journal, or a WAL that could not be kept open, keeps
                # FULL: SQLite's own sync.
                record.info[WAL_SYNCED] = True
                synchronous = "NORMAL"
            cursor.execute(f"PRAGMA synchronous={synchronous}")
            cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            cursor.close()
            if not writable:
                # mode=ro guards the main file, but raw SQL could ATTACH it again read-write.
                dbapi_connection.set_authorizer(_refuse_attach)

    @contextmanager
    def write_transaction(self, conn: Connection | None = None) -> Iterator[Connection]:
        # SQLAlchemy's transaction begun at once: code that begins its own (alembic) joins it.
        self._refuse_writes()
        transaction = AppendTransaction(
            conn or self._writers.current(), self._writer_lock, self._wal_sync
        )
        try:
            with transaction as conn, conn.begin():
                yield conn
        except BaseException:
            transaction.ended = True  # first: see trm_store.sqlite_transaction
            transaction.finish()
            raise

    def append_transaction(
        self,
        stream_id: str,
        known_epoch: int,
        write: AppendWrite[T],
        appends: Sequence[Sequence[PreparedAppend]],
    ) -> T:
        """`write` in `BEGIN IMMEDIATE` ... `COMMIT` on this thread's writer connection (see
        `AppendTransaction`), the heads read first."""
        self._refuse_writes()
        transaction = AppendTransaction(self._writers.current(), self._writer_lock, self._wal_sync)
        try:
            with transaction as conn:
                return write(conn, heads(conn, stream_id, known_epoch), appends)
        except BaseException:
            transaction.ended = True  # first: see trm_store.sqlite_transaction
            transaction.finish()
            raise

    def rebuild_lock(self, *, wait: bool) -> AbstractContextManager[RebuildLock | None]:
        self._refuse_writes()
        return file_rebuild_lock(self.path, wait=wait)

    def _refuse_writes(self) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(f"store {self.describe()} was opened read_only=True")
        if self._wal_sync is not None and (failed := self._wal_sync.failed) is not None:
            raise StoreError(f"nothing written: an earlier write's sync failed: {failed}")

    def close(self) -> None:
        # This thread's transaction an interrupt cut short (twice) let go of first: its
        # connection's lock, which closing waits for, and the writer lock.
        finish_cut_short(self._writers.mine())
        self._writer_lock.let_go_stale()
        self._writers.close()
        self._writer_lock.close_file()
        self.engine.dispose()

    def read_statement(self) -> AbstractContextManager[Connection]:
        return self.read_transaction()

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
