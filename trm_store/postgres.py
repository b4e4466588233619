"""PostgreSQL backend: a transaction-level advisory lock serialises appends.

Sequences hand out numbers in start order, not commit order, so a reader following positions could
skip an event that commits late. Taking one advisory lock per write transaction and computing the
next position under it makes position order equal commit order, with no gaps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

from sqlalchemy import URL, Connection, Engine, Table, create_engine, text
from sqlalchemy.exc import DBAPIError, ProgrammingError

from trm_store.driver import DriverSql, execute
from trm_store.errors import ReadOnlyStoreError, StoreError
from trm_store.json_codec import serialize_json
from trm_store.wakeups import NOTIFY_APPENDED

__all__ = ["PostgresBackend"]

APPEND_LOCK_KEY = 0x74726D  # "trm"
_READ_ONLY = "-c default_transaction_read_only=on"
_LOCK = f"pg_advisory_xact_lock({APPEND_LOCK_KEY})"
_APPEND_LOCK = DriverSql(f"SELECT {_LOCK}")
_APPEND_LOCK_AND_NOTIFY = DriverSql(f"SELECT {_LOCK}, {NOTIFY_APPENDED}")
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

    def write_transaction(self) -> AbstractContextManager[Connection]:
        return self._locked(_APPEND_LOCK)

    def append_transaction(self) -> AbstractContextManager[Connection]:
        """`write_transaction`, which also wakes subscribers (`trm_store.wakeups`): the statement
        that takes the lock queues the notification too (no extra round trip); PostgreSQL
        delivers it at commit, and never for an append that rolls back."""
        return self._locked(_APPEND_LOCK_AND_NOTIFY)

    @contextmanager
    def _locked(self, lock: DriverSql) -> Iterator[Connection]:
        if self.read_only:
            raise ReadOnlyStoreError(f"store {self.describe()} was opened read_only=True")
        with self.engine.connect() as conn, conn.begin():
            execute(conn, lock, {})
            yield conn

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def read_transaction(self, lock: Sequence[Table] = ()) -> Iterator[Connection]:
        """REPEATABLE READ, its snapshot taken after `lock` is locked in ACCESS SHARE mode.

        A rebuild renames a new table in under an exclusive lock. A reader whose snapshot came
        first but who reads the table after the rename would find the new table with none of
        its rows visible: locking first makes the swap wait for the reader, or the reader for
        the swap, whose rows its snapshot then sees. (LOCK takes no snapshot; the first query
        does.)
        """
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                if lock:
                    _lock_for_reading(conn, lock)
                yield conn

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
