"""The SQLite fast path is fenced: PostgreSQL statements take SQLAlchemy's execution path.

So on PostgreSQL `handle_error` listeners see the store's own statements, `echo` logs them, and a
connection that dies under an append is invalidated: the append fails typed, writes nothing, and
the next one (its retry included) succeeds exactly once on a fresh connection. The same holds for
an append of many events, which goes as `COPY` (`trm_store.rows_insert.insert_rows`), outside
that path.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DBAPIError

from tests.store.helpers import TOTALS, added, totals
from trm_store import EventIdConflictError, StoreError, open_store
from trm_store.connect import normalise_url
from trm_store.driver import DriverSql, fetch_all
from trm_store.rows_insert import COPY_MIN_ROWS


def _terminate(url: str, pid: int) -> None:
    """Kill the server process behind `pid` from another connection, and wait until it is gone."""
    admin = create_engine(normalise_url(url))
    try:
        with admin.begin() as conn:
            killed = conn.execute(
                text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid}
            ).scalar_one()
        assert killed, f"backend {pid} was not terminated"
    finally:
        admin.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("events", "insert"), [(1, "INSERT INTO events"), (COPY_MIN_ROWS, "COPY events")]
)
def test_a_killed_postgres_connection_is_invalidated_and_the_next_append_succeeds(
    pg_url: str, caplog: pytest.LogCaptureFixture, events: int, insert: str
) -> None:
    with open_store(pg_url, projections=TOTALS) as store:
        store.append("s", [added(1)])
        engine = store._backend.engine
        handled: list[tuple[str, bool]] = []
        armed = [True]

        @event.listens_for(engine, "handle_error")
        def _handled(context: ExceptionContext) -> None:
            handled.append((context.statement or "", context.is_disconnect))

        @event.listens_for(engine, "before_cursor_execute")
        def _kill(_conn: Any, cursor: Any, statement: str, *_rest: Any) -> None:
            if armed and statement.startswith(insert):
                armed.clear()
                _terminate(pg_url, cursor.connection.info.backend_pid)

        ids = [str(uuid.uuid4()) for _ in range(events)]
        batch = [added(2 + k, event_id=event_id) for k, event_id in enumerate(ids)]
        engine.echo = True
        with (
            caplog.at_level(logging.INFO, logger="sqlalchemy.engine.Engine"),
            pytest.raises(StoreError, match="lost the connection") as info,
        ):
            store.append("s", batch)
        engine.echo = False
        cause = info.value.__cause__
        assert isinstance(cause, DBAPIError) and cause.connection_invalidated
        assert (insert, True) in [(s[: len(insert)], d) for s, d in handled]
        assert insert in caplog.text  # echo saw the store's own statement
        assert store.head_position() == 1  # nothing of the failed append was written

        retried = store.append("s", batch)  # a fresh connection
        again = store.append("s", batch)  # exactly once
        [third] = store.append("s", [added(100)])
        assert [e.position for e in retried] == [e.position for e in again]
        assert [e.position for e in retried] == list(range(2, events + 2))
        assert third.position == events + 2
        assert [e.event_id for e in store.read_all()][1:] == [*ids, third.event_id]
        amounts = 1 + sum(range(2, events + 2)) + 100
        assert totals(store) == {"s": (amounts, events + 2)}


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("events", "insert"), [(1, "INSERT INTO events"), (COPY_MIN_ROWS, "COPY events")]
)
def test_an_insert_gets_sqlalchemy_s_execution_context_and_error_handling(
    pg_url: str, events: int, insert: str
) -> None:
    """What instrumentation relies on (Sentry and OpenTelemetry set attributes on the execution
    context): a context, a cursor still open after the statement with its row count, an error
    raised by a listener seen by `handle_error`, the parameters of a failed executemany shown
    as SQLAlchemy shows them (a few rows, not all)."""
    with open_store(pg_url, projections=TOTALS) as store:
        engine = store._backend.engine
        seen: list[tuple[str, bool, int, bool]] = []
        handled: list[str] = []
        shown: list[str] = []
        armed: list[str] = []

        @event.listens_for(engine, "before_cursor_execute")
        def _before(
            _conn: Any, _cursor: Any, statement: str, _p: Any, context: Any, _m: bool
        ) -> None:
            if statement.startswith(insert):
                context.span = "mine"  # as instrumentation does
                if armed:
                    raise RuntimeError(armed.pop())

        @event.listens_for(engine, "after_cursor_execute")
        def _after(
            _conn: Any, cursor: Any, statement: str, _p: Any, context: Any, many: bool
        ) -> None:
            if statement.startswith(insert):
                seen.append((context.span, cursor.closed, cursor.rowcount, many))

        @event.listens_for(engine, "handle_error")
        def _handled(context: ExceptionContext) -> None:
            handled.append(str(context.original_exception))
            shown.append(str(context.sqlalchemy_exception))

        store.append("s", [added(k) for k in range(events)])
        assert seen == [("mine", False, events, events > 1)]
        armed.append("a listener's own error")
        with pytest.raises(RuntimeError, match="a listener's own error"):
            store.append("s", [added(k) for k in range(events)])
        assert handled == ["a listener's own error"]
        assert store.head_position() == events

        [taken] = store.append("t", [added(1, event_id=str(uuid.uuid4()))])
        many = [added(k, event_id=str(uuid.uuid4())) for k in range(200)]
        many[150] = added(150, event_id=taken.event_id)
        with pytest.raises(EventIdConflictError):
            store.append("u", many)  # a COPY of 200 rows, refused by the event-id index
        assert "displaying 10 of 200 total bound parameter sets" in shown[-1]
        assert shown[-1].count("'test.added'") == 10  # not the 200 rows' data


def test_only_sqlite_takes_the_fast_path(store_url: str) -> None:
    """On PostgreSQL a store statement reaches `handle_error` listeners; on SQLite (the fast path,
    where a local file has no disconnect to detect) it does not."""
    with open_store(store_url, projections={}) as store:
        engine = store._backend.engine
        handled: list[str] = []

        @event.listens_for(engine, "handle_error")
        def _handled(context: ExceptionContext) -> None:
            handled.append(context.statement or "")

        broken = DriverSql("SELECT no_such_column FROM events")
        sql, _, on_cursor = broken.compiled(engine.dialect)
        assert on_cursor is (store.dialect == "sqlite")
        with pytest.raises(DBAPIError), engine.connect() as conn:
            fetch_all(conn, broken, {})
        assert handled == ([] if on_cursor else [sql])


def test_the_dialect_is_registered_once_where_the_backend_is_built(tmp_path: Path) -> None:
    """Importing the store registers nothing; building a SQLite backend registers `sqlite+trm`,
    once, however many stores are opened."""
    program = f"""
from sqlalchemy.dialects import registry
from sqlalchemy.exc import NoSuchModuleError
import trm_store.bootstrap, trm_store.sqlite, trm_store.sqlite_dialect
try:
    registry.load("sqlite.trm")
except NoSuchModuleError:
    pass
else:
    raise SystemExit("importing the store registered the dialect")
from trm_store import open_store
open_store("sqlite:///{tmp_path / "a.db"}", projections={{}}).close()
loader = registry.impls["sqlite.trm"]
open_store("sqlite:///{tmp_path / "b.db"}", projections={{}}).close()
assert registry.impls["sqlite.trm"] is loader, "registered again"
print(registry.load("sqlite.trm").__name__)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "TransactionalSqliteDialect\n"
