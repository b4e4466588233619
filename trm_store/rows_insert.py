"""An insert of many rows at once, as each backend takes it fastest: an append's events.

On SQLite (the fast path of `trm_store.driver`) multi-row `INSERT ... VALUES` statements; on
PostgreSQL an `executemany` through SQLAlchemy for a few rows, a `COPY` for more (through
SQLAlchemy too: `copy_rows`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.engine import Dialect, ExecutionContext

from trm_store.driver import on_cursor, send

__all__ = [
    "COPY_MIN_ROWS",
    "COPY_ROWS",
    "ROWS_PER_STATEMENT",
    "RowsInsert",
    "copy_rows",
    "insert_rows",
    "row_chunks",
]

ROWS_PER_STATEMENT = 64
"""The most rows one multi-row INSERT carries on SQLite: 64 rows of the events table's 9 columns
are 576 parameters, under the 999 that SQLite builds before 3.32 allow."""
_PLACEHOLDERS = {"qmark": "?", "pyformat": "%s"}
"""A positional placeholder in the paramstyle of each driver the store runs on (pysqlite:
qmark; psycopg: pyformat, which takes `%s` with a sequence of values as well)."""


COPY_MIN_ROWS = 16
"""From how many rows `insert_rows` sends them as `COPY` on PostgreSQL. `executemany` costs
psycopg ~12 us of client CPU a row, `COPY` ~5 (psycopg formats the rows in C), but one more
round trip: measured on loopback (raw psycopg, 50-event rows into trm's table, medians of 190),
16 rows took 473 us (285 us of CPU) as `executemany` and 511 us (214 us) as `COPY`, 32 rows
666 (409) against 617 (239). An append holds the store's lock for the whole insert, so with
several writers its CPU is what the others wait for (`bench/writers_bench.py`)."""


COPY_ROWS = "trm_copy_rows"
"""The execution option that marks an executemany of rows to be sent as `COPY` (`copy_rows`)."""
_AS_COPY = {COPY_ROWS: True}


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
    (psycopg pipelines it: one round trip), more as one `COPY ... FROM STDIN` (`copy_sql`,
    sent by `copy_rows`).
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
            conn.exec_driver_sql(insert.copy_sql, list(rows), execution_options=_AS_COPY)
        else:
            conn.exec_driver_sql(insert.sql(dialect, 1), list(rows))
        return
    start = 0
    for size in row_chunks(len(rows)):
        values = (  # one row (every single-event append) as it is; more flattened in C
            rows[start] if size == 1 else list(chain.from_iterable(rows[start : start + size]))
        )
        send(conn, insert.sql(dialect, size), values, many=False).close()
        start += size


def copy_rows(
    cursor: Any, statement: str, parameters: Sequence[Sequence[Any]], context: ExecutionContext
) -> bool:
    """A `do_executemany` listener of a PostgreSQL store's engine: an executemany marked with
    `COPY_ROWS` is sent as psycopg's `COPY` (`statement`), its parameter sets the rows, which
    psycopg formats in C (`Copy.write_row`); True when it sent it.

    SQLAlchemy's own execution path runs around it (its documented hook for a dialect's
    executemany), so the statement gets what every other one does: cursor listeners with their
    execution context, `echo`, `handle_error`, invalidation of a connection that died, its
    error types."""
    if not context.execution_options.get(COPY_ROWS):
        return False
    with cursor.copy(statement) as copy:
        for row in parameters:
            copy.write_row(row)
    return True


def row_chunks(rows: int) -> Iterator[int]:
    """How many rows each of `insert_rows`' statements carries on SQLite, in order: the largest
    power of two that is left, at most `ROWS_PER_STATEMENT` (50 rows: 32, 16, 2)."""
    while rows:
        size = min(ROWS_PER_STATEMENT, 1 << (rows.bit_length() - 1))
        yield size
        rows -= size
