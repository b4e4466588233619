"""The events of an append go in as tuples (`trm_store.rows_insert.RowsInsert`): on SQLite as
multi-row statements of up to 64 rows, a power of two each; on PostgreSQL one `executemany`
below `COPY_MIN_ROWS` rows, one `COPY` from there.

What must hold whatever the number of rows: every event written once, in order, with its own
values (also text that means something to `COPY`'s format: tabs, newlines, backslashes, `\\N`);
at most 7 statement texts on SQLite, none past SQLite's oldest parameter limit (999); an append
refused in a late statement, or late in a `COPY`, leaves nothing of itself.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event
from sqlalchemy.dialects import postgresql as postgresql_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

from tests.store.helpers import EVENT_INSERTS, TOTALS, added, totals
from trm_store import EventIdConflictError, NewEvent, Store, open_store
from trm_store.rows_insert import COPY_MIN_ROWS, ROWS_PER_STATEMENT, RowsInsert, row_chunks

SIZES = [1, 2, 3, 15, 16, 17, 63, 64, 65, 127, 128, 129, 200, 1000]
"""Appends across every chunk boundary and `COPY_MIN_ROWS`, and one of 1,000 events (15 statements
of 64 and 40 on SQLite)."""


def _inserts(store: Store) -> list[tuple[str, Any, bool]]:
    """The event inserts the driver is handed from now on (an INSERT or a COPY): (SQL,
    parameters, executemany)."""
    sent: list[tuple[str, Any, bool]] = []

    @event.listens_for(store._backend.engine, "before_cursor_execute")
    def _seen(_conn: Any, _cursor: Any, sql: str, params: Any, _ctx: Any, many: bool) -> None:
        if sql.startswith((*EVENT_INSERTS, "COPY events ")):
            sent.append((sql, params, many))

    return sent


def test_appends_of_every_size_are_written_whole_and_in_order(store_url: str) -> None:
    with open_store(store_url, projections=TOTALS) as store:
        sent = _inserts(store)
        head = 0
        for size in SIZES:
            recorded = store.append(f"s{size}", [added(k) for k in range(size)])
            assert [e.position for e in recorded] == list(range(head + 1, head + size + 1))
            head += size
            read = store.read_stream(f"s{size}")
            assert [(e.version, e.data["amount"]) for e in read] == [
                (k + 1, k) for k in range(size)
            ]
            assert read == recorded  # every column read back as written, recorded_at too
        assert store.head_position() == head == sum(SIZES)
        assert totals(store) == {f"s{n}": (n * (n - 1) // 2, n) for n in SIZES}
        if store.dialect == "sqlite":
            texts = {sql for sql, _, _ in sent}
            assert len(texts) <= 7
            rows = [sql.count("(?") for sql, _, _ in sent]
            assert all(n <= ROWS_PER_STATEMENT and n & (n - 1) == 0 for n in rows)
            assert all(len(params) <= 999 and not many for _, params, many in sent)
            assert sum(rows) == sum(SIZES)
        else:  # one statement an append: executemany or COPY, a row a parameter set (one
            # row: execute)
            assert [(sql.split()[0], len(params) if many else 1) for sql, params, many in sent] == [
                ("COPY" if n >= COPY_MIN_ROWS else "INSERT", n) for n in SIZES
            ]


AWKWARD = ["'", "''", "?", "?1", ":position", "$1", "%", "%s", "%(x)s", "%%", "\\", "\\'", "é✓🙂"]
AWKWARD += ["\t", "\n", "\r", "\r\n", "\\N", "\\.", "\n\\.\n", "\\t", "\x1f", "\x7f"]
"""Text a statement built by hand could take for SQL or for a placeholder, and text that means
something in `COPY`'s text format (its delimiter, line ends, escapes, NULL and end-of-data)."""


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    groups=st.lists(
        st.tuples(st.integers(1, 150), st.sampled_from(AWKWARD)), min_size=1, max_size=4
    )
)
def test_a_batch_of_streams_of_any_sizes_is_one_contiguous_run(
    store_url: str, groups: list[tuple[int, str]]
) -> None:
    """`append_batch` across streams: the rows of several streams in the same statements, with
    stream ids and data that hold quotes, placeholders' characters, `COPY`'s special characters
    and non-ASCII text."""
    with open_store(store_url, projections=TOTALS) as store:
        head = store.head_position()
        tag = uuid.uuid4().hex[:8]  # the examples share the fixture's database
        streams = [f"{tag}{odd}{i}" for i, (_, odd) in enumerate(groups)]
        items = [
            (
                stream,
                [NewEvent("test.added", {"amount": k, "note": f"{odd}{k}{odd}"}) for k in range(n)],
                0,
            )
            for stream, (n, odd) in zip(streams, groups, strict=True)
        ]
        recorded = store.append_batch(items)
        assert [e.position for e in recorded] == list(range(head + 1, head + len(recorded) + 1))
        assert [
            (e.stream_id, e.version, e.data["amount"], e.data["note"])
            for e in store.read_all(after_position=head)
        ] == [
            (stream, k + 1, k, f"{odd}{k}{odd}")
            for stream, (n, odd) in zip(streams, groups, strict=True)
            for k in range(n)
        ]


def test_an_append_refused_in_a_late_statement_writes_nothing(store_url: str) -> None:
    """The 150th event reuses a recorded id: on SQLite the third statement fails, after two
    statements (128 rows) went in; the transaction takes them back."""
    with open_store(store_url, projections=TOTALS) as store:
        [taken] = store.append("first", [added(1, event_id=str(uuid.uuid4()))])
        events = [added(k) for k in range(200)]
        events[149] = added(149, event_id=taken.event_id)
        with pytest.raises(EventIdConflictError):
            store.append("late", events)
        assert store.head_position() == 1
        assert store.stream_version("late") == 0
        assert totals(store) == {"first": (1, 1)}
        again = store.append("late", [added(k) for k in range(200)])  # the log goes on at 2
        assert [again[0].position, again[-1].position] == [2, 201]


def test_event_rows_bind_values_of_exact_builtin_types(sqlite_url: str) -> None:
    """sqlite3 binds an exact `str`, `int` or `float` at once; for a subclass (of `str`: the
    JSON text of an event's data or meta) it first looks up an adapter, then its protocol's
    `__adapt__`, whose miss formats an AttributeError that it drops, then `__conform__`, twice
    an appended event. Every value of every event row is of an exact built-in type."""
    with open_store(sqlite_url, projections=TOTALS) as store:
        sent = _inserts(store)
        recorded = store.append("s", [added(1), added(2, meta={"why": "a test"})])
        assert store.read_stream("s") == recorded
    [(_sql, params, _many)] = sent
    assert {type(value) for value in params} == {int, str}


def test_sqlite_event_inserts_need_no_statement_journal(sqlite_url: str) -> None:
    """A plain INSERT can fail on its 50th row after 49 went in, so SQLite copies every page a
    multi-row statement touches to a statement journal first, to take back that statement
    alone (a temporary file past 64 KiB). An append is all or nothing: OR ROLLBACK ends the
    whole transaction on a conflict instead, and SQLite keeps no statement journal for it.
    What a conflict leaves is in the test above."""
    with open_store(sqlite_url, projections=TOTALS) as store:
        sent = _inserts(store)
        store.append("s", [added(k) for k in range(100)])
    assert [sql.split(" (")[0] for sql, _params, _many in sent] == [
        "INSERT OR ROLLBACK INTO events"
    ] * len(list(row_chunks(100)))


def test_each_database_gets_its_own_statement_text() -> None:
    """The texts are cached by database and placeholder style: SQLite's OR ROLLBACK never
    reaches PostgreSQL, whatever style its driver is given."""
    insert = RowsInsert("events", ["a", "b"])
    assert insert.sql(sqlite_dialect.dialect(), 1).startswith("INSERT OR ROLLBACK INTO events ")
    qmark_postgres = postgresql_dialect.psycopg.dialect(paramstyle="qmark")
    assert insert.sql(qmark_postgres, 1) == "INSERT INTO events (a, b) VALUES (?, ?)"
