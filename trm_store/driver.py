"""Statements compiled once per dialect, and how they are sent: the SQLite fast path, fenced.

Every append runs a handful of small statements. Measured on SQLite, SQLAlchemy's execution path
costs 25-60 us per statement, more than the statement itself, so on SQLite they skip
it: their SQL is compiled once per dialect by SQLAlchemy (so the paramstyle is the driver's;
`RowsInsert` writes its own, with positional placeholders), then handed to the connection's own
cursor. What callers still get from SQLAlchemy there:

- the transaction: the statements run on the Connection's DBAPI connection, in its transaction;
- errors: driver errors are wrapped as SQLAlchemy's `DBAPIError` subclasses (`IntegrityError`,
  `OperationalError`, ...), the same types `Connection.execute` raises;
- observability: `before_cursor_execute` and `after_cursor_execute` listeners are called with
  the SQL and parameters sent (their `context` argument is None: there is no execution context).

What they do not get there: `handle_error` listeners, `echo`, and invalidation of a connection
that died (a local file has no disconnects). Every other dialect (PostgreSQL) sends the same SQL
and parameters through SQLAlchemy's `Connection.exec_driver_sql`, its full execution path: all of
those work (an append of many events goes as `COPY` that way too: `trm_store.rows_insert`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta, timezone
from operator import itemgetter
from typing import Any, cast

from sqlalchemy import Column, Connection, DateTime, TextClause, bindparam, text
from sqlalchemy.engine import Dialect
from sqlalchemy.engine.interfaces import DBAPIConnection, DBAPICursor
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

__all__ = [
    "Compiled",
    "DriverSql",
    "bind_processor",
    "execute",
    "execute_many",
    "fetch_all",
    "on_cursor",
    "padded_in",
    "send",
    "send_bare",
]

Params = Mapping[str, Any]
Binder = Callable[[Params], Any]


Compiled = tuple[str, Binder, bool]
"""A statement as one dialect sends it: (SQL in the driver's paramstyle, what turns a parameter
mapping into the driver's parameters, whether it goes straight to the DBAPI cursor: the SQLite
fast path). A plain tuple: unpacked for every statement, where a NamedTuple's unpacking would
cost an iterator."""


def on_cursor(dialect: Dialect) -> bool:
    """The fence: only SQLite (the store's engines are pysqlite, where the fast path was
    measured) skips SQLAlchemy's execution path."""
    return dialect.name == "sqlite"


class DriverSql:
    """A statement compiled once for each dialect that sends it: SQL text with `:name`
    parameters, or a SQLAlchemy statement whose bind parameters are named (e.g. an upsert built
    with `on_conflict_do_update`).

    `literals` (text only) are parameters whose values never change: SQLAlchemy renders them
    into the SQL (quoted by the dialect's own literal processors), so no call binds them again.
    """

    __slots__ = ("_compiled", "_last", "literals", "statement")

    def __init__(
        self, sql: str | ClauseElement, literals: Mapping[str, str | int] | None = None
    ) -> None:
        self.statement = text(sql) if isinstance(sql, str) else sql
        self.literals = dict(literals or {})
        if self.literals and not isinstance(self.statement, TextClause):
            raise TypeError("literals are rendered into SQL text only")
        self._compiled: dict[tuple[str, str], Compiled] = {}
        self._last: tuple[Dialect | None, Compiled | None] = (None, None)
        """The dialect last asked for and its statement, in one tuple (set in one step, so a
        thread never pairs one's dialect with another's statement)."""

    def compiled(self, dialect: Dialect) -> Compiled:
        """The SQL in `dialect`'s paramstyle, its binder, and how it is sent."""
        # The dialect object last asked for, the usual (one store's engine), recognised by
        # identity: its name and paramstyle, each looked up on it, missed the type cache, and
        # with the key's tuple and its lookup cost ~150 ns a statement, four an append.
        last_dialect, last = self._last
        if last_dialect is dialect and last is not None:
            return last
        key = (dialect.name, dialect.paramstyle)
        found = self._compiled.get(key)
        if found is None:
            clause = self.statement
            kwargs = {}
            if self.literals:
                assert isinstance(clause, TextClause)
                # Rendering literals needs a value for every parameter; the others stay binds.
                names = clause.compile(dialect=dialect).binds
                clause = clause.bindparams(
                    *(
                        bindparam(n, self.literals[n], literal_execute=True)
                        if n in self.literals
                        else bindparam(n, None)
                        for n in names
                    )
                )
                kwargs = {"render_postcompile": True}
            compiled = cast(SQLCompiler, clause.compile(dialect=dialect, compile_kwargs=kwargs))
            order = tuple(compiled.positiontup or ()) if compiled.positional else None
            found = self._compiled[key] = (compiled.string, _binder(order), on_cursor(dialect))
        self._last = (dialect, found)
        return found

    def __repr__(self) -> str:
        return f"DriverSql({str(self.statement)!r})"


def _binder(order: tuple[str, ...] | None) -> Binder:
    """Named paramstyles take the mapping as it is; positional ones a tuple in `order`."""
    if order is None:
        return _as_is
    if not order:
        return lambda _params: ()
    if len(order) == 1:
        (name,) = order
        return lambda params: (params[name],)
    return itemgetter(*order)  # a tuple of the values, in C (an executemany binds every row)


def _as_is(params: Params) -> Params:
    return params


def send(
    conn: Connection,
    sql: str,
    bound: Any,
    many: bool,
    dbapi_connection: DBAPIConnection | None = None,
) -> DBAPICursor:
    """The fast path: `sql` straight to the connection's DBAPI cursor (SQLite only); on
    `dbapi_connection` when the caller holds it already (`conn`'s own)."""
    if dbapi_connection is None:
        dbapi_connection = conn.connection.dbapi_connection
        assert dbapi_connection is not None, "the connection was invalidated"
    cursor = dbapi_connection.cursor()
    observed = _observed(conn)
    if observed:
        for listener in conn.dispatch.before_cursor_execute:
            sql, bound = listener(conn, cursor, sql, bound, None, many)
    try:
        if many:
            cursor.executemany(sql, bound)
        else:
            cursor.execute(sql, bound)
    except conn.dialect.loaded_dbapi.Error as e:
        cursor.close()
        raise _driver_error(conn, sql, bound, e) from e
    if observed:
        for after in conn.dispatch.after_cursor_execute:
            after(conn, cursor, sql, bound, None, many)
    return cursor


def send_bare(conn: Connection, dbapi_connection: DBAPIConnection, sql: str) -> None:
    """`sql`, a statement of no parameters and no rows (`BEGIN IMMEDIATE`, `COMMIT`), on
    `conn`'s own SQLite connection, which the caller holds: as `send` sends it when no
    listener is there to see it, without its cursor (~5,000 instructions a statement less,
    two an append: callgrind)."""
    if _observed(conn):
        send(conn, sql, (), False, dbapi_connection).close()
        return
    try:
        dbapi_connection.execute(sql)
    except sqlite3.Error as e:
        raise _driver_error(conn, sql, (), e) from e


def _observed(conn: Connection) -> bool:
    """SQLAlchemy's own test before each of its event points: set for good once any connection
    event listener is added to the connection, its engine or the Engine class."""
    return conn._has_events or conn.engine._has_events


def _driver_error(conn: Connection, sql: str, bound: Any, error: Exception) -> StatementError:
    """The driver's `error` as SQLAlchemy raises it (its types: OperationalError, ...)."""
    return DBAPIError.instance(
        sql, bound, error, conn.dialect.loaded_dbapi.Error, dialect=conn.dialect
    )


def fetch_all(conn: Connection, statement: DriverSql, params: Params) -> list[tuple[Any, ...]]:
    """Run one statement; every row it returns, as tuples."""
    sql, bind, on_cursor = statement.compiled(conn.dialect)
    if not on_cursor:
        result = conn.exec_driver_sql(sql, bind(params))
        return [tuple(row) for row in result] if result.returns_rows else []
    cursor = send(conn, sql, bind(params), many=False)
    try:
        return list(cursor.fetchall()) if cursor.description else []
    finally:
        cursor.close()


def _changed(conn: Connection, statement: DriverSql, params: Any, many: bool) -> int:
    sql, bind, on_cursor = statement.compiled(conn.dialect)
    bound = list(map(bind, params)) if many else bind(params)
    if not on_cursor:
        return int(conn.exec_driver_sql(sql, bound).rowcount)
    cursor = send(conn, sql, bound, many)
    try:
        return int(cursor.rowcount)
    finally:
        cursor.close()


def execute_many(conn: Connection, statement: DriverSql, rows: Sequence[Params]) -> int:
    """Run one statement once per parameter set with the driver's `executemany`; rows changed."""
    return _changed(conn, statement, rows, many=True)


def execute(conn: Connection, statement: DriverSql, params: Params) -> int:
    """Run one statement that returns no rows; the number of rows it changed."""
    return _changed(conn, statement, params, many=False)


def padded_in(values: Sequence[Any], name: str = "i") -> tuple[int, dict[str, Any]]:
    """The parameters `{name}0`..`{name}{size-1}` of an IN list of (non-empty) `values`, padded
    to a power of two with the last value, and that size: a few statements, each compiled once,
    serve every count of values."""
    size = 1 << (len(values) - 1).bit_length()
    params = {f"{name}{k}": v for k, v in enumerate(values)}
    params.update({f"{name}{k}": values[-1] for k in range(len(values), size)})
    return size, params


def bind_processor(column: Column[Any], dialect: Dialect) -> Callable[[Any], Any] | None:
    """How SQLAlchemy converts a value for `column` before the driver gets it (None: as is).

    Values sent on the driver go through it, so they are stored exactly as SQLAlchemy stores
    them (e.g. a DateTime as naive text on SQLite). A DateTime column whose converter gives,
    for the probes below, what `datetime.isoformat` gives (SQLite's default storage format)
    has its datetimes converted by that instead: the same text without SQLAlchemy's `%`
    formatting of a dict of seven fields (timeit: 1,067 against 1,277 ns; callgrind: ~4,600
    instructions an append less; a property test checks the two agree).
    """
    processor = column.type.dialect_impl(dialect).bind_processor(dialect)
    if processor is None or not isinstance(column.type, DateTime):
        return processor

    def convert(value: Any) -> Any:
        # Naive, to the microsecond: an offset dropped, as SQLAlchemy's SQLite text drops it.
        # A subclass of datetime (its own `isoformat`) goes to SQLAlchemy, as a date does.
        if type(value) is datetime:
            return value.isoformat(" ", "microseconds")[:26]
        return processor(value)

    return convert if all(processor(t) == convert(t) for t in _TIME_PROBES) else processor


_TIME_PROBES = (
    datetime(2026, 12, 7, 16, 53, 15, 43181, tzinfo=UTC),
    datetime(1, 1, 1),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-5))),
)
"""Where SQLAlchemy's text and `isoformat`'s could part: no microseconds, a year of one digit, an
offset other than UTC's."""
