"""Statements sent straight to the driver keep SQLAlchemy's transaction, error types and events."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from trm_store.connect import normalise_url
from trm_store.driver import DriverSql, execute, execute_many, fetch_all, send_bare

CREATE = DriverSql("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
INSERT = DriverSql("INSERT INTO t (k, v) VALUES (:k, :v)")
SELECT = DriverSql("SELECT k, v FROM t WHERE k >= :low ORDER BY k")
DOUBLE = DriverSql("UPDATE t SET v = v || v WHERE k > :k")


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    engine = create_engine(normalise_url(store_url))
    with engine.begin() as conn:
        execute(conn, CREATE, {})
    yield engine
    engine.dispose()


def test_rows_in_and_out_within_sqlalchemy_s_transaction(engine: Engine) -> None:
    with engine.begin() as conn:
        assert execute_many(conn, INSERT, [{"k": 1, "v": "a"}, {"v": "b", "k": 2}]) == 2
        assert fetch_all(conn, SELECT, {"low": 0}) == [(1, "a"), (2, "b")]
        assert execute(conn, DOUBLE, {"k": 1}) == 1
    with engine.connect() as conn:
        assert fetch_all(conn, SELECT, {"low": 2}) == [(2, "bb")]


def test_a_rolled_back_transaction_takes_driver_statements_with_it(engine: Engine) -> None:
    with pytest.raises(RuntimeError), engine.begin() as conn:
        execute(conn, INSERT, {"k": 1, "v": "a"})
        raise RuntimeError("abort")
    with engine.connect() as conn:
        assert fetch_all(conn, SELECT, {"low": 0}) == []


@pytest.mark.parametrize(
    ("statement", "params", "error"),
    [
        (INSERT, {"k": 1, "v": None}, IntegrityError),
        (DriverSql("SELECT * FROM no_such_table"), {}, (OperationalError, ProgrammingError)),
    ],
)
def test_driver_errors_come_out_as_sqlalchemy_s_types(
    engine: Engine, statement: DriverSql, params: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error) as raised, engine.begin() as conn:
        execute(conn, statement, params)
    assert str(statement.statement).split()[0] in str(raised.value)


def test_cursor_event_listeners_see_each_statement_sent(engine: Engine) -> None:
    seen: list[tuple[str, str, Any, bool]] = []

    def before(_conn: Any, _cursor: Any, sql: str, params: Any, _ctx: Any, many: bool) -> None:
        seen.append(("before", sql, params, many))

    def after(_conn: Any, _cursor: Any, sql: str, params: Any, _ctx: Any, many: bool) -> None:
        seen.append(("after", sql, params, many))

    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "after_cursor_execute", after)
    with engine.begin() as conn:
        execute_many(conn, INSERT, [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}])
    sql, _, _ = INSERT.compiled(engine.dialect)
    assert [(w, s, m) for w, s, _, m in seen] == [("before", sql, True), ("after", sql, True)]


def test_a_bare_statement_is_seen_by_listeners_and_fails_as_sqlalchemy_s_type(
    sqlite_url: str,
) -> None:
    """`send_bare` (a writer's BEGIN IMMEDIATE and COMMIT) skips the cursor only while no
    listener would see it; its error is SQLAlchemy's type, as from every statement sent."""
    engine = create_engine(normalise_url(sqlite_url))
    seen: list[str] = []
    try:
        with engine.connect() as conn:
            raw = conn.connection.dbapi_connection
            assert raw is not None
            raw.isolation_level = None  # BEGIN / COMMIT by hand, as a writer connection
            send_bare(conn, raw, "BEGIN IMMEDIATE")
            send_bare(conn, raw, "COMMIT")
            with pytest.raises(OperationalError, match="no transaction is active"):
                send_bare(conn, raw, "COMMIT")
            event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
            send_bare(conn, raw, "BEGIN IMMEDIATE")
            send_bare(conn, raw, "COMMIT")
    finally:
        engine.dispose()
    assert seen == ["BEGIN IMMEDIATE", "COMMIT"]


def test_listeners_on_one_connection_see_its_statements_only(engine: Engine) -> None:
    seen: list[str] = []

    def before(_conn: Any, _cursor: Any, sql: str, *_rest: Any) -> None:
        seen.append(sql)

    with engine.connect() as listened, listened.begin():
        event.listen(listened, "before_cursor_execute", before)
        execute(listened, INSERT, {"k": 1, "v": "a"})
    with engine.begin() as other:
        execute(other, INSERT, {"k": 2, "v": "b"})
    assert seen == [INSERT.compiled(engine.dialect)[0]]


def test_the_sql_is_compiled_once_per_dialect_in_its_paramstyle(engine: Engine) -> None:
    sql, bind, _ = INSERT.compiled(engine.dialect)
    assert INSERT.compiled(engine.dialect)[0] is sql
    params = {"v": "x", "k": 1}
    if engine.dialect.name == "sqlite":
        assert (sql, bind(params)) == ("INSERT INTO t (k, v) VALUES (?, ?)", (1, "x"))
    else:
        assert (sql, bind(params)) == ("INSERT INTO t (k, v) VALUES (%(k)s, %(v)s)", params)


def test_dialects_asked_in_turn_each_get_their_own_text_from_any_thread() -> None:
    """`compiled` answers the dialect it was last asked for at once: dialects asked for in
    turn (stores of both backends in one process), by several threads switching as often as
    they can, each still get the text of their own paramstyle."""
    dialects: list[Dialect] = [
        sqlite.dialect(),
        sqlite.dialect(paramstyle="named"),
        create_engine("postgresql+psycopg://trm@127.0.0.1/never_connected").dialect,
    ]
    wanted = {id(d): DriverSql(INSERT.statement).compiled(d)[0] for d in dialects}
    statement = DriverSql(INSERT.statement)
    wrong: list[str] = []

    def ask(offset: int) -> None:
        for k in range(3000):
            dialect = dialects[(k + offset) % len(dialects)]
            if statement.compiled(dialect)[0] != wanted[id(dialect)]:
                wrong.append(dialect.paramstyle)

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(3)]
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes, as often as can be
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(previous)
    assert len(set(wanted.values())) == 3
    assert wrong == []


def test_literals_are_rendered_quoted_and_only_the_other_parameters_are_bound(
    engine: Engine,
) -> None:
    hostile = "it's'; DROP TABLE t; --"
    with engine.begin() as conn:
        execute_many(conn, INSERT, [{"k": 1, "v": hostile}, {"k": 2, "v": "plain"}])
    pick = DriverSql("SELECT k FROM t WHERE v = :v AND k >= :low", {"v": hostile})
    sent: list[Any] = []

    @event.listens_for(engine, "before_cursor_execute")
    def record(*args: Any) -> None:
        sent.append(args[3])

    with engine.connect() as conn:
        assert fetch_all(conn, pick, {"low": 0}) == [(1,)]
        assert fetch_all(conn, pick, {"low": 2}) == []
    assert [len(p) for p in sent] == [1, 1]  # only `low` is bound, as a tuple or a mapping
    with engine.connect() as conn:
        assert fetch_all(conn, SELECT, {"low": 0}) == [(1, hostile), (2, "plain")]
