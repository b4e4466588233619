"""PostgreSQL backend: a transaction-level advisory lock serialises appends.

Sequences hand out numbers in start order, not commit order, so a reader following positions could
skip an event that commits late. Taking one advisory lock per write transaction and computing the
next position under it makes position order equal commit order, with no gaps.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from typing import TypeVar

from sqlalchemy import URL, Connection, Engine, Table, create_engine, event, text
from sqlalchemy.exc import DBAPIError, ProgrammingError

from trm_store.append_heads import HEADS_PREPARABLE, append_heads
from trm_store.backend import AppendWrite
from trm_store.errors import ReadOnlyStoreError, StoreError
from trm_store.json_codec import serialize_json
from trm_store.postgres_append import (
    APPEND_ROWS,
    SERVER_NUMBERED_MAX_CHARS,
    json_size,
    numbered_insert,
)
from trm_store.postgres_outcome import LAST_QUERY_HIDDEN
from trm_store.postgres_prepared import Prepared
from trm_store.postgres_read_only import guard_read_only
from trm_store.postgres_session import set_session_on_connect
from trm_store.postgres_writers import PostgresWriters
from trm_store.prepared import PreparedAppend
from trm_store.rebuild_lock import RebuildLock, advisory_rebuild_lock
from trm_store.rows_insert import copy_rows
from trm_store.store_url import shown_url
from trm_store.wakeups import NOTIFY_APPENDED

__all__ = ["PostgresBackend"]

T = TypeVar("T")

APPEND_LOCK_NAMESPACE = 0x74726141  # "trmA"; the rebuild lock's key space is another
"""The append lock is (namespace, hash of the schema): one writer at a time per store, while
stores in other schemas of the same database append in parallel."""
WRITER_SLOTS = 4
"""How many connections a store's writers hold at once (`trm_store.postgres_writers`), besides
the pool (5, and 10 more on demand), which stays the readers'.

Appends queue for the append lock holding a connection: unbounded, 100 writing threads would
open 100 connections to wait on one lock. A few connections are all writers use anyway (they
run one at a time); the others wait in the process."""
_READ_ONLY = "-c default_transaction_read_only=on"
# coalesce: with no schema on the search path current_schema() is NULL, and a strict lock
# function given NULL would lock nothing.
_LOCK = f"pg_advisory_xact_lock({APPEND_LOCK_NAMESPACE}, hashtext(coalesce(current_schema(), '')))"
_APPEND_LOCK = f"SELECT {_LOCK}"
_LOCK_AND_NOTIFY = Prepared(
    "trm_append_lock", f"PREPARE trm_append_lock AS SELECT {_LOCK}, {NOTIFY_APPENDED}"
)
_HEADS = Prepared(
    "trm_append_heads", f"PREPARE trm_append_heads(text, bigint) AS {HEADS_PREPARABLE}"
)
_APPEND_START = f"EXECUTE {_LOCK_AND_NOTIFY.name}; EXECUTE {_HEADS.name}(%(s)s, %(k)s)"
"""Two statements, each prepared once per writer connection: sent as text they would be parsed
and planned at every append (callgrind of the server, 1-event appends: the lock's SELECT alone
cost ~27,000 instructions an append as text)."""
_UNDEFINED_TABLE = "42P01"


def _lock_for_reading(conn: Connection, tables: Sequence[Table]) -> None:
    names = ", ".join(conn.dialect.identifier_preparer.format_table(t) for t in tables)
    try:
        with conn.begin_nested():  # a savepoint: a missing table must not end the transaction
            conn.execute(text(f"LOCK TABLE {names} IN ACCESS SHARE MODE"))
    except ProgrammingError as e:
        # Tables not created yet: the projection is stale, which the caller finds and reports.
        if getattr(e.orig, "sqlstate", None) != _UNDEFINED_TABLE:
            raise


class PostgresBackend:
    """A PostgreSQL database shared by many processes and machines."""

    def __init__(self, url: URL, *, read_only: bool) -> None:
        self.url = url
        self.read_only = read_only
        connect_args = {}
        if read_only:
            # Keep options given in the URL (e.g. a search_path) and add read-only transactions.
            given = url.query.get("options", "")
            options = " ".join([*(given if isinstance(given, tuple) else (given,)), _READ_ONLY])
            connect_args["options"] = options.strip()
        self.engine: Engine = create_engine(
            url, connect_args=connect_args, pool_pre_ping=True, json_serializer=serialize_json
        )
        set_session_on_connect(self.engine)  # ISO dates, UTC
        event.listen(self.engine, "do_executemany", copy_rows)  # an append's COPY
        self._writers = PostgresWriters(self.engine, WRITER_SLOTS)
        if read_only:
            guard_read_only(self.engine, self.describe())

    def write_transaction(
        self, conn: Connection | None = None
    ) -> AbstractContextManager[Connection]:
        return self._locked(_APPEND_LOCK, conn)

    def append_transaction(
        self,
        stream_id: str,
        known_epoch: int,
        write: AppendWrite[T],
        appends: Sequence[Sequence[PreparedAppend]],
    ) -> T:
        """`write` in `write_transaction`, which also wakes subscribers (`trm_store.wakeups`) and
        reads the heads and the projections' rows (`trm_store.append_heads`), all in the round trip
        of `BEGIN` (`trm_store.postgres_writers`): the statement that takes the lock queues the
        notification too (PostgreSQL delivers it at commit, and never for an append that rolls
        back); the next one, with a snapshot of its own taken once the lock is held, reads.
        Every statement goes through SQLAlchemy's execution path (so `handle_error`, echo and
        disconnect invalidation see them)."""
        self._refuse_if_read_only()
        with self._writers.transaction(
            _APPEND_START, {"s": stream_id, "k": known_epoch}, prepare=(_LOCK_AND_NOTIFY, _HEADS)
        ) as (conn, rows):
            return write(conn, append_heads(rows), appends)

    def append_server_numbered(
        self,
        appends: Sequence[Sequence[PreparedAppend]],
        recorded_at: datetime,
        ours: Mapping[str, int],
    ) -> list[tuple[int, int]] | None:
        """`appends` numbered under the lock by the database, the lock, insert and `COMMIT` in
        one query on a warm connection, else the lock's round trip first
        (`trm_store.postgres_append`). Each event's position
        and version, in order; None when they are too large for it, or when it inserted nothing
        (a stream not at its expected version, a projection to act on, an event id taken)."""
        self._refuse_if_read_only()
        if json_size(appends) > SERVER_NUMBERED_MAX_CHARS:
            return None
        statement, values = numbered_insert(appends, recorded_at, ours)
        try:
            rows = self._writers.committed(
                f"EXECUTE {_LOCK_AND_NOTIFY.name}",
                statement,
                values,
                prepare=(_LOCK_AND_NOTIFY, APPEND_ROWS),
            )
        except DBAPIError as e:
            if e.statement == LAST_QUERY_HIDDEN and e.connection_invalidated:  # lost once it left
                raise StoreError(
                    f"lost the connection to {self.describe()} with an append in flight, which"
                    " may have been written (a retry with the same event ids is recorded once):"
                    f" {e.orig}"
                ) from e
            raise
        return sorted((int(p), int(v)) for p, v in rows or ()) or None

    @contextmanager
    def _locked(self, lock: str, conn: Connection | None = None) -> Iterator[Connection]:
        self._refuse_if_read_only()
        if conn is None:  # a writer's connection, the lock taken in the round trip of `BEGIN`
            with self._writers.transaction(lock) as (conn, _):
                yield conn
            return
        with conn.begin():  # a caller's own connection (a rebuild's)
            conn.exec_driver_sql(lock)
            yield conn

    def rebuild_lock(self, *, wait: bool) -> AbstractContextManager[RebuildLock | None]:
        self._refuse_if_read_only()
        return advisory_rebuild_lock(self.engine, wait=wait)

    def _refuse_if_read_only(self) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(f"store {self.describe()} was opened read_only=True")

    def close(self) -> None:
        self._writers.close()
        self.engine.dispose()

    @contextmanager
    def read_statement(self) -> Iterator[Connection]:
        """Autocommit: one statement is its own snapshot, and needs no `BEGIN` and `COMMIT`
        round trips (2 of a newest-event read's 4). A read-only store keeps its transaction:
        its guard (`trm_store.postgres_read_only`) checks each statement inside one."""
        if self.read_only:
            with self.read_transaction() as conn:
                yield conn
            return
        with self.engine.connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    @contextmanager
    def read_transaction(
        self, lock: Sequence[Table] = (), conn: Connection | None = None
    ) -> Iterator[Connection]:
        """REPEATABLE READ, its snapshot taken after `lock` is locked in ACCESS SHARE mode.

        A rebuild renames a new table in under an exclusive lock. A reader whose snapshot came
        first but who reads the table after the rename would find the new table with none of
        its rows visible: locking first makes the swap wait for the reader, or the reader for
        the swap, whose rows its snapshot then sees. (LOCK takes no snapshot; the first query
        does.)
        """
        with nullcontext(conn) if conn is not None else self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin() as transaction:
                if lock:
                    _lock_for_reading(conn, lock)
                yield conn
                # What the block changed in the session ends with it (`Store.query` may have
                # rolled back already).
                if self.read_only and transaction.is_active:
                    transaction.rollback()

    def translate(self, error: Exception) -> StoreError | None:
        if not isinstance(error, DBAPIError):
            return None
        sqlstate = getattr(error.orig, "sqlstate", None)
        if sqlstate == "25006":
            return ReadOnlyStoreError(f"store {self.describe()} is read-only: {error.orig}")
        if (sqlstate or "").startswith("08") or error.connection_invalidated:
            return StoreError(f"lost the connection to {self.describe()}: {error.orig}")
        return None

    def describe(self) -> str:
        return shown_url(self.url)
