"""What a PostgreSQL writer (`trm_store.postgres_writers`) does with psycopg's connection
itself, under SQLAlchemy's: find it, read a query's last rows, close it at once."""

from __future__ import annotations

from contextlib import suppress
from typing import Any, cast

import psycopg
from sqlalchemy import Connection
from sqlalchemy.pool import PoolProxiedConnection

from trm_store.postgres_prepared import AS_IS

__all__ = ["LastRowsCursor", "close_now", "driver_connection", "last_rows"]


def driver_connection(connection: PoolProxiedConnection) -> psycopg.Connection[Any]:
    """psycopg's connection under the pool's proxy (None once SQLAlchemy invalidated it: take
    it before anything that may)."""
    raw = connection.dbapi_connection
    assert isinstance(raw, psycopg.Connection)  # the driver `trm_store.connect` selects
    return raw


class LastRowsCursor(psycopg.Cursor[Any]):
    """A cursor that, after a query of several statements, holds the rows of the last one that
    returned any, as `last_rows` (psycopg's moves to the first result: here `BEGIN`'s, which has
    none; and in a query that ends a transaction the last is `COMMIT`'s)."""

    last_rows: list[Any]

    def execute(self, *args: Any, **kwargs: Any) -> LastRowsCursor:
        super().execute(*args, **kwargs)
        self.last_rows = []
        while True:
            if self.description is not None:
                self.last_rows = self.fetchall()
            if not self.nextset():
                return self


def close_now(raw: psycopg.Connection[Any]) -> None:
    """Close the driver's connection at once, in whatever state (the server rolls back)."""
    with suppress(Exception):
        raw.close()


def last_rows(conn: Connection, raw: psycopg.Connection[Any], sql: str) -> list[Any]:
    """Send `sql` (several statements, as it is) through SQLAlchemy; the rows of the last
    statement that returned any. Only this query's cursor is a `LastRowsCursor`: a caller's own
    statements in the transaction (`write_transaction`) get psycopg's usual cursor."""
    default_cursor, raw.cursor_factory = raw.cursor_factory, LastRowsCursor
    try:
        result = conn.exec_driver_sql(sql, execution_options=AS_IS)
        rows = cast(LastRowsCursor, result.context.cursor).last_rows
        result.close()
        return rows
    finally:
        raw.cursor_factory = default_cursor
