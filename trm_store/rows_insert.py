"""An insert of many rows at once, as each backend takes it fastest: an append's events.

On SQLite (the fast path of `trm_store.driver`) multi-row `INSERT ... VALUES` statements; on
PostgreSQL an `executemany` through SQLAlchemy for a few rows, a `COPY` for more (through
SQLAlchemy too: `copy_rows`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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


_INSERT_VERB = {"sqlite": "INSERT OR ROLLBACK"}
"""SQLite: a conflict ends the whole transaction at once, which is what an append does anyway
(all of it or nothing). With a plain INSERT (ABORT), SQLite must be able to undo one statement
of a transaction: each multi-row statement after BEGIN copies every page it touches to a
statement journal first, spilled to a temporary file past 64 KiB (strace of `writers_bench.py`'s
100-event appends: 11 such pages written an append, a file made and unlinked every fourth)."""


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
    """An INSERT of many rows into one table, in `columns` order (`insert_rows`).

    On SQLite (the fast path) the rows go as multi-row `VALUES` statements: one driver call, one
    bind of every parameter in C, one release of the GIL for up to `ROWS_PER_STATEMENT` rows,
    where `executemany` binds, steps, resets and gives up the GIL for each row. Statements carry
    a power of two of rows (50 rows: 32 + 16 + 2), so at most 7 texts exist, each prepared once
    by the driver's statement cache. Measured (`bench/writers_instructions.py`: 50-event
    appends at `full`): 143k instructions per appended event with `executemany` and dict rows,
    127-129k with this. What `before_cursor_execute` listeners see on SQLite changes with it:
    one statement of several rows, its parameters one flat list (not `executemany`'s rows).

    On PostgreSQL fewer than `COPY_MIN_ROWS` rows go as one `executemany` through SQLAlchemy
    (psycopg pipelines it: one round trip), more as one `COPY ... FROM STDIN` (`copy_sql`,
    sent by `copy_rows`).
    """

    __slots__ = ("_sql", "columns", "copy_sql", "table")

    def __init__(self, table: str, columns: Sequence[str]) -> None:
        self.table = table
        self.columns = tuple(columns)
        self._sql: dict[tuple[str, str, int], str] = {}
        self.copy_sql = f"COPY {table} ({', '.join(self.columns)}) FROM STDIN"

    def sql(self, dialect: Dialect, rows: int) -> str:
        """The statement that inserts `rows` rows (1 for `executemany`) in `dialect`'s style;
        NotImplementedError for a driver whose paramstyle takes no positional placeholder."""
        key = (dialect.name, dialect.paramstyle, rows)
        found = self._sql.get(key)
        if found is None:
            mark = _PLACEHOLDERS.get(dialect.paramstyle)
            if mark is None:
                raise NotImplementedError(f"no positional placeholder for {dialect.paramstyle}")
            row = f"({', '.join([mark] * len(self.columns))})"
            verb = _INSERT_VERB.get(dialect.name, "INSERT")
            found = self._sql[key] = (
                f"{verb} INTO {self.table} ({', '.join(self.columns)}) VALUES "
                + ", ".join([row] * rows)
            )
        return found

    def __repr__(self) -> str:
        return f"RowsInsert({self.table!r}, {self.columns!r})"


def insert_rows(conn: Connection, insert: RowsInsert, values: list[Any]) -> None:
    """Insert the rows whose values `values` holds one after another, each row in the
    statement's column order (none: nothing is sent), in the connection's transaction.

    Flat, not a tuple a row: on SQLite each statement's parameters are a slice of it, and an
    append's rows are not one more object an event for the garbage collector to count (with
    several threads appending, the queued appends' objects set off its collections).
    """
    if not values:
        return
    dialect = conn.dialect
    width = len(insert.columns)
    if not on_cursor(dialect):
        rows = list(zip(*[iter(values)] * width, strict=True))
        if len(rows) >= COPY_MIN_ROWS and dialect.driver == "psycopg":
            conn.exec_driver_sql(insert.copy_sql, rows, execution_options=_AS_COPY)
        else:
            conn.exec_driver_sql(insert.sql(dialect, 1), rows)
        return
    count = len(values) // width
    if count & (count - 1) == 0 and count <= ROWS_PER_STATEMENT:  # one statement: most appends
        send(conn, insert.sql(dialect, count), values, many=False).close()
        return
    start = 0
    for size in row_chunks(count):
        end = start + size * width
        send(conn, insert.sql(dialect, size), values[start:end], many=False).close()
        start = end


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
