"""SQLite's write transaction: `BEGIN IMMEDIATE` ... `COMMIT` under the database's writer lock,
and, at `durability="full"`, the WAL synced once the lock is let go.

Interrupts (a KeyboardInterrupt, or whatever a signal handler raises) land where Python code
starts, after a call returns or at a loop's jump back: anywhere in here, and at the start of
`__exit__`, before any of it runs. So what a transaction may hold is found from the state it
leaves, not from a step that may never run. Its connection names it (`info[_WRITING]`) from
before it takes anything until it has let go of everything; the caller's `except` clause around
the `with` marks it `ended` in its first statement (nothing can interrupt before that) and calls
`finish`, which lets go of whatever is still held: SQLite's transaction rolled back, the writer
lock (`WriterLock.let_go_stale`), the connection's `IN_USE` lock. `finish` may itself be
interrupted: the thread's next transaction on the connection, or `store.close()` on it, finishes
the job first. A transaction named there and not `ended` is still open, its `with` block still
running: a transaction begun inside it (a projection or a signal handler that appends) is
refused at once, as nested.
"""

from __future__ import annotations

from contextlib import nullcontext, suppress

from sqlalchemy import Connection
from sqlalchemy.engine.interfaces import DBAPIConnection

from trm_store.driver import send_bare
from trm_store.errors import StoreError
from trm_store.sqlite_writer_lock import WriterLock
from trm_store.wal_sync import WAL_SYNCED, WalSync
from trm_store.writer_connections import CLOSE_AFTER, IN_USE

__all__ = ["AppendTransaction", "finish_cut_short"]

_BEGIN_IMMEDIATE = "BEGIN IMMEDIATE"
_COMMIT = "COMMIT"

_WRITING = "trm_writing"
"""Names, in a writer connection's `info`, the transaction that may hold anything on it."""


def _rollback(conn: Connection, dbapi_connection: DBAPIConnection) -> None:
    """End whatever transaction is open, SQLAlchemy's and SQLite's."""
    if conn.in_transaction():
        conn.rollback()
    if dbapi_connection.in_transaction:
        dbapi_connection.rollback()


def _rollback_quietly(conn: Connection, dbapi_connection: DBAPIConnection) -> None:
    """`_rollback` on the way out of a failed or interrupted transaction: its own failure (a
    connection an interrupt closed) must not replace what is being raised, nor keep SQLite's
    transaction open. SQLAlchemy's transactions are ended as their `with` blocks (`begin`,
    `begin_nested`) end them, in case an interrupt cut those short: the connection would
    otherwise refuse every later statement."""
    for transaction in (conn.get_nested_transaction(), conn.get_transaction()):
        if transaction is not None:
            with suppress(Exception):
                transaction.__exit__(BaseException, None, None)
    with suppress(Exception):
        if dbapi_connection.in_transaction:
            dbapi_connection.rollback()


def _close_if_asked(conn: Connection, info: dict[str, object]) -> None:
    """Close the connection, now that the write is over, if a `close` made while this thread
    wrote on it asked to (`CLOSE_AFTER`), or if SQLAlchemy invalidated it: it does so when an
    interrupt, or a `TimeoutError` (which it takes for asyncio's), comes out of one of its
    statements (a projection's); kept, the next write would revalidate it onto a connection of
    the readers' pool, with no `IN_USE` lock. The thread's next write opens another."""
    if info.get(CLOSE_AFTER):
        conn.close()
    elif conn.invalidated:
        with suppress(Exception):  # closing may fail as its statement did: what is raised stays
            conn.close()


def finish_cut_short(conn: Connection | None) -> None:
    """Let go of what `conn`'s last transaction still holds if an interrupt cut its end short
    (a store closing on this thread)."""
    if conn is not None and (last := conn.info.get(_WRITING)) is not None and last.ended:
        last.finish()


class AppendTransaction:
    """`BEGIN IMMEDIATE` ... `COMMIT`, both sent on the driver, on a writer connection, under the
    database's writer lock (`trm_store.sqlite_writer_lock`).

    SQLAlchemy's transaction begins only if the block runs a statement through it (the
    dialect's `do_begin` then finds SQLite's transaction open and adds nothing), and then ends
    with it: an append, which sends only driver statements, skips its bookkeeping. A class, not
    a `contextmanager` generator: it runs for every append, where each Python call counts.

    Its user wraps the `with` in `try`, and in `except BaseException:` first sets `ended`, then
    calls `finish` (the module says why).
    """

    __slots__ = (
        "_conn",
        "_dbapi_connection",
        "_in_use",
        "_info",
        "_sync",
        "_writer_lock",
        "ended",
    )
    _dbapi_connection: DBAPIConnection

    def __init__(self, conn: Connection, writer_lock: WriterLock, sync: WalSync | None) -> None:
        """`sync`: the store's syncs of its WAL at `durability="full"` (None otherwise),
        which a commit on a connection marked `WAL_SYNCED` waits for once the lock is let go."""
        self._conn = conn
        self._info = info = conn.info
        self._in_use = info.get(IN_USE) or nullcontext()  # a writer connection's: see IN_USE
        self._writer_lock = writer_lock
        self._sync = sync
        self.ended = False
        """Its `with` block is over: whatever it still holds, an interrupt left behind."""

    def __enter__(self) -> Connection:
        conn, info = self._conn, self._info
        if (last := info.get(_WRITING)) is not None:
            if not last.ended:
                raise StoreError(
                    "write transactions do not nest: this thread's write transaction is still open"
                )
            last.finish()
        info[_WRITING] = self
        self._writer_lock.acquire(self)
        self._in_use.__enter__()
        if conn.closed:
            raise StoreError("the store was closed while this write began: nothing written")
        dbapi_connection = conn.connection.dbapi_connection
        assert dbapi_connection is not None, "the connection was invalidated"
        self._dbapi_connection = dbapi_connection
        _rollback(conn, dbapi_connection)  # anything left open by a failed rollback
        send_bare(conn, dbapi_connection, _BEGIN_IMMEDIATE)
        return conn

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        """Commit (or roll back), let the writer lock go, wait for the WAL's sync, let the
        connection go; the connection stops naming it only once all of it is done. A
        transaction that failed is synced too (the block may have committed before it
        raised), its sync's own failure not replacing what is raised."""
        conn, dbapi_connection = self._conn, self._dbapi_connection
        committed = False
        try:
            try:
                if kind is None:
                    if conn.in_transaction():
                        conn.commit()
                    elif dbapi_connection.in_transaction:
                        send_bare(conn, dbapi_connection, _COMMIT)
                    committed = True
            finally:
                if not committed:
                    _rollback_quietly(conn, dbapi_connection)
                self._writer_lock.release(self)
            if (sync := self._sync) is not None and self._info.get(WAL_SYNCED):
                if committed:
                    sync.sync()
                else:
                    with suppress(StoreError):
                        sync.sync()
        finally:
            self._in_use.__exit__(None, None, None)
        self._info[_WRITING] = None
        _close_if_asked(conn, self._info)

    def finish(self) -> None:
        """Once `ended`: let go of whatever this transaction still holds, if its connection
        still names it; each step harmless if done already, so an interrupt here leaves the
        rest to the next call. Not synced: the commit, if any, was never acknowledged, and the
        next write's sync covers it."""
        info = self._info
        if info.get(_WRITING) is not self:
            return
        conn = self._conn
        dbapi_connection = getattr(self, "_dbapi_connection", None)
        if dbapi_connection is not None:  # else no `BEGIN` was sent
            _rollback_quietly(conn, dbapi_connection)
        self._writer_lock.let_go_stale()
        if (in_use := info.get(IN_USE)) is not None and in_use._is_owned():
            in_use.release()
        info[_WRITING] = None
        _close_if_asked(conn, info)
