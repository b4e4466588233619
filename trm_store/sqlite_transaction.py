"""SQLite's write transaction: `BEGIN IMMEDIATE` ... `COMMIT` under the database's writer lock,
and, at `durability="full"`, the WAL synced once the lock is let go."""

from __future__ import annotations

from contextlib import nullcontext, suppress

from sqlalchemy import Connection
from sqlalchemy.engine.interfaces import DBAPIConnection

from trm_store.append_heads import heads
from trm_store.backend import AppendStart
from trm_store.driver import send_bare
from trm_store.errors import StoreError
from trm_store.sqlite_writer_lock import WriterLock
from trm_store.wal_sync import WAL_SYNCED, WalSync
from trm_store.writer_connections import IN_USE

__all__ = ["AppendTransaction", "HeadsRead"]

_BEGIN_IMMEDIATE = "BEGIN IMMEDIATE"
_COMMIT = "COMMIT"

_WRITING = "trm_writing"
"""Marks a writer connection (in its `info`) while its write transaction is open."""


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

    __slots__ = ("_conn", "_dbapi_connection", "_in_use", "_info", "_sync", "_writer_lock")
    _dbapi_connection: DBAPIConnection

    def __init__(self, conn: Connection, writer_lock: WriterLock, sync: WalSync | None) -> None:
        """`sync`: the store's syncs of its WAL at `durability="full"` (None otherwise),
        which a commit on a connection marked `WAL_SYNCED` waits for once the lock is let go."""
        self._conn = conn
        self._info = info = conn.info
        self._in_use = info.get(IN_USE) or nullcontext()  # a writer connection's: see IN_USE
        self._writer_lock = writer_lock
        self._sync = sync

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
            send_bare(conn, dbapi_connection, _BEGIN_IMMEDIATE)
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

    def _let_go(self, *, ended: bool = False, failed: bool = False) -> None:
        """The writer lock, then, once the transaction that `ended` is synced
        (`trm_store.wal_sync`), the connection, even if an interrupt lands in between. A
        transaction that `failed` is synced too (the block may have committed before it
        raised), its sync's own failure not replacing what is raised."""
        try:
            self._writer_lock.release()
            if ended and self._sync is not None and self._info.get(WAL_SYNCED):
                if failed:
                    with suppress(StoreError):
                        self._sync.sync()
                else:
                    self._sync.sync()
        finally:
            self._in_use.__exit__(None, None, None)

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        conn, dbapi_connection = self._conn, self._dbapi_connection
        committed = False
        try:
            if kind is not None:
                _rollback_quietly(conn, dbapi_connection)
                return
            try:
                if conn.in_transaction():
                    conn.commit()
                elif dbapi_connection.in_transaction:
                    send_bare(conn, dbapi_connection, _COMMIT)
            except BaseException:
                _rollback_quietly(conn, dbapi_connection)
                raise
            committed = True
        finally:
            self._info[_WRITING] = False
            self._let_go(ended=True, failed=not committed)


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
