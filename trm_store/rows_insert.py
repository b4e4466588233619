"""An insert of many rows at once, as each backend takes it fastest: an append's events.

On SQLite (the fast path of `trm_store.driver`) multi-row `INSERT ... VALUES` statements; on
PostgreSQL an `executemany` through SQLAlchemy for a few rows, a `COPY` for more.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect

from trm_store.driver import after_listeners, before_listeners, observed, on_cursor, send

__all__ = ["COPY_MIN_ROWS", "ROWS_PER_STATEMENT", "RowsInsert", "insert_rows", "row_chunks"]

ROWS_PER_STATEMENT = 64
"""The most rows one multi-row INSERT carries on SQLite: 64 rows of the events table's 9 columns
are 576 parameters, under the 999 that SQLite builds before 3.32 allow."""
_PLACEHOLDERS = {"qmark": "?", "pyformat": "%s"}
"""A positional placeholder in the paramstyle of each driver the store runs on (pysqlite:
qmark; psycopg: pyformat, which takes `%s` with a sequence of values as well)."""


class RowsInsert:
    """An INSERT of many rows into one table, each row a tuple in `columns` order.

    On SQLite (the fast path) the rows go as multi-row `VALUES` statements: one driver call, one
    bind of every parameter in C, one release of the GIL for up to `ROWS_PER_STATEMENT` rows,
    where `executemany` binds, steps, resets and gives up the GIL for each row. Statements carry
    a power of two of rows (50 rows: 32 + 16 + 2), so at most 7 texts exist, each prepared once
    by the driver's statement cache. Measured (`bench/writers_instructions.py`: 50-event
    appends at `full`): 143k instructions per appended event with `executemany` and dict rows,
    127-129k with this. What `before_cursor_execute` listeners see on SQLite changes with it:
    one statement of several rows, its parameters one flat sequence (not `executemany`'s rows).

    On PostgreSQL fewer than `COPY_MIN_ROWS` rows go as one `executemany` through SQLAlchemy
    (psycopg pipelines it: one round trip), more as one `COPY ... FROM STDIN` (`copy_sql`).
    """

    __slots__ = ("_columns", "_sql", "copy_sql", "table")

    def __init__(self, table: str, columns: Sequence[str]) -> None:
        self.table = table
        self._columns = tuple(columns)
        self._sql: dict[tuple[str, int], str] = {}
        self.copy_sql = f"COPY {table} ({', '.join(self._columns)}) FROM STDIN"

    def sql(self, dialect: Dialect, rows: int) -> str:
        """The statement that inserts `rows` rows (1 for `executemany`) in `dialect`'s style;
        NotImplementedError for a driver whose paramstyle takes no positional placeholder."""
        key = (dialect.paramstyle, rows)
        found = self._sql.get(key)
        if found is None:
            mark = _PLACEHOLDERS.get(dialect.paramstyle)
            if mark is None:
                raise NotImplementedError(f"no positional placeholder for {dialect.paramstyle}")
            row = f"({', '.join([mark] * len(self._columns))})"
            found = self._sql[key] = (
                f"INSERT INTO {self.table} ({', '.join(self._columns)}) VALUES "
                + ", ".join([row] * rows)
            )
        return found

    def __repr__(self) -> str:
        return f"RowsInsert({self.table!r}, {self._columns!r})"


def insert_rows(conn: Connection, insert: RowsInsert, rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert `rows` (tuples in the statement's column order; none: nothing is sent) in the
    connection's transaction."""
    if not rows:
        return
    dialect = conn.dialect
    if not on_cursor(dialect):
        if len(rows) >= COPY_MIN_ROWS and dialect.driver == "psycopg":
            _copy_in(conn, insert.copy_sql, rows)
        else:
            conn.exec_driver_sql(insert.sql(dialect, 1), list(rows))
        return
    start = 0
    for size in row_chunks(len(rows)):
        values = (  # one row (every single-event append) as it is
            rows[start] if size == 1 else [v for row in rows[start : start + size] for v in row]
        )
        send(conn, insert.sql(dialect, size), values, many=False).close()
        start += size


COPY_MIN_ROWS = 16
"""From how many rows `insert_rows` sends them as `COPY` on PostgreSQL. `executemany` costs
psycopg ~12 us of client CPU a row, `COPY` ~5 (psycopg formats the rows in C), but one more
round trip: measured on loopback (raw psycopg, 50-event rows into trm's table, medians of 190),
16 rows took 473 us (285 us of CPU) as `executemany` and 511 us (214 us) as `COPY`, 32 rows
666 (409) against 617 (239). An append holds the store's lock for the whole insert, so with
several writers its CPU is what the others wait for (`bench/writers_bench.py`)."""


def _copy_in(conn: Connection, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """`rows` through psycopg's `COPY` (`sql`) in the connection's transaction, with what
    `exec_driver_sql` gives a statement: the cursor listeners (`executemany=True`, the rows as
    parameters), `echo`, and SQLAlchemy's own handling of an error, which calls `handle_error`
    listeners, invalidates a connection that died and raises SQLAlchemy's error type (a private
    method of SQLAlchemy's: `tests/store/test_canaries.py` checks it)."""
    dbapi_connection = conn.connection.dbapi_connection
    assert dbapi_connection is not None, "the connection was invalidated"
    cursor: Any = dbapi_connection.cursor()
    watched = observed(conn)
    if watched:
        sql, rows = before_listeners(conn, cursor, sql, rows, True)
    logger = conn.engine.logger
    if logger.isEnabledFor(logging.INFO):  # what SQLAlchemy's `echo` tests
        logger.info("%s [%d rows]", sql, len(rows))
    try:
        with cursor.copy(sql) as copy:
            for row in rows:
                copy.write_row(row)
    except BaseException as e:
        conn._handle_dbapi_exception(e, sql, rows, cursor, None)
    finally:
        cursor.close()
    if watched:
        after_listeners(conn, cursor, sql, rows, True)


def row_chunks(rows: int) -> Iterator[int]:
    """How many rows each of `insert_rows`' statements carries on SQLite, in order: the largest
    power of two that is left, at most `ROWS_PER_STATEMENT` (50 rows: 32, 16, 2)."""
    while rows:
        size = min(ROWS_PER_STATEMENT, 1 << (rows.bit_length() - 1))
        yield size
        rows -= size
