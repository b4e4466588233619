"""PostgreSQL backend: a transaction-level advisory lock serialises appends.

Sequences hand out numbers in start order, not commit order, so a reader following positions could
skip an event that commits late. Taking one advisory lock per write transaction and computing the
next position under it makes position order equal commit order, with no gaps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext

from sqlalchemy import URL, Connection, Engine, Table, create_engine, text
from sqlalchemy.exc import DBAPIError, ProgrammingError

from trm_store.backend import AppendStart, CheckpointAdvance
from trm_store.driver import DriverSql, fetch_all
from trm_store.errors import ReadOnlyStoreError, StoreError
from trm_store.json_codec import serialize_json
from trm_store.log import heads
from trm_store.postgres_read_only import guard_read_only
from trm_store.postgres_writers import PostgresWriters
from trm_store.rebuild_lock import RebuildLock, advisory_rebuild_lock
from trm_store.wakeups import NOTIFY_APPENDED

__all__ = ["PostgresBackend"]

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
_APPEND_LOCK_AND_NOTIFY = f"SELECT {_LOCK}, {NOTIFY_APPENDED}"
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
        self._writers = PostgresWriters(self.engine, WRITER_SLOTS)
        self._heads_and_advance_sql: DriverSql | None = None
        if read_only:
            guard_read_only(self.engine, self.describe())

    def write_transaction(
        self, conn: Connection | None = None
    ) -> AbstractContextManager[Connection]:
        return self._locked(_APPEND_LOCK, conn)

    @contextmanager
    def append_transaction(
        self, stream_id: str, advance: CheckpointAdvance | None
    ) -> Iterator[AppendStart]:
        """`write_transaction`, which also wakes subscribers (`trm_store.wakeups`): the statement
        that takes the lock queues the notification too (no extra round trip); PostgreSQL
        delivers it at commit, and never for an append that rolls back. It yields the heads
        read under the lock. Every statement goes through SQLAlchemy's execution path (so
        `handle_error`, echo and disconnect invalidation see them): psycopg's pipeline mode
        would save the heads' round trip, at the price of that fence (measured and not taken:
        bench/README.md, writers_bench)."""
        with self._locked(_APPEND_LOCK_AND_NOTIFY) as conn:
            if advance is None:
                yield (conn, *heads(conn, stream_id), None)
                return
            ((log_head, version, moved),) = fetch_all(
                conn,
                self._heads_and_advance(advance),
                {"s": stream_id, "events": advance.events},
            )
            yield conn, int(log_head), int(version), int(moved)

    def _heads_and_advance(self, advance: CheckpointAdvance) -> DriverSql:
        """The heads' read, which also moves the checkpoints at the log's head by the append's
        events (a data-modifying CTE): the round trip of the `UPDATE` saved, under the lock.
        Built once per store (its projections do not change)."""
        if self._heads_and_advance_sql is None:
            self._heads_and_advance_sql = DriverSql(
                "WITH h AS (SELECT coalesce(max(position), 0) AS head FROM events),"
                " moved AS (UPDATE projection_state SET checkpoint = h.head + :events FROM h"
                f" WHERE checkpoint = h.head AND ({advance.condition}) RETURNING 1)"
                " SELECT h.head,"
                " (SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = :s),"
                " (SELECT count(*) FROM moved) FROM h",
                advance.literals,
            )
        return self._heads_and_advance_sql

    @contextmanager
    def _locked(self, lock: str, conn: Connection | None = None) -> Iterator[Connection]:
        self._refuse_if_read_only()
        if conn is None:  # a writer's connection, the lock taken in the round trip of `BEGIN`
            with self._writers.transaction(lock) as conn:
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
                if self.read_only:  # what the block changed in the session ends with it
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
        return self.url.render_as_string(hide_password=True)
