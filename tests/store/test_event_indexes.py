"""Each index of the events table is there for a query the store sends, and serves it: the
statements a store call really sends are captured and explained (SQLite's EXPLAIN QUERY PLAN,
PostgreSQL's EXPLAIN, on a log big enough and analysed so its planner chooses for real).

The table has exactly the indexes listed in `SERVES`: a new one needs a query here, and an index
no query uses is dropped (issue 16 point 5).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, inspect

from tests.conftest import _pg_schema_url
from tests.store.helpers import TOTALS, Added, added
from trm_store import NewEvent, Store, open_store, register_event_type

register_event_type("test.rare", Added)

Call = Callable[[Store], object]

SERVES: dict[tuple[str, ...], list[tuple[str, Call]]] = {
    ("position",): [
        ("read_all, the log in order", lambda s: list(s.read_all(100, 50))),
    ],
    ("event_id",): [
        # A retried append looks its event ids up (and the unique index refuses a reused id).
        ("a retried append", lambda s: s.append("w:0", [_retried()])),
    ],
    ("stream_id", "stream_version"): [
        ("newest event of a stream", lambda s: s.read_stream("w:3", backwards=True, limit=1)),
        ("a stream from a version", lambda s: s.read_stream("w:3", 20, limit=5)),
        ("a stream's version", lambda s: s.stream_version("w:3")),
        ("read_all(stream_prefix=)", lambda s: list(s.read_all(stream_prefix="w:3"))),
    ],
    ("type", "position"): [
        ("read_all(types=) of one type", lambda s: list(s.read_all(types=["test.rare"]))),
        (
            "read_all(types=) of two types",
            lambda s: list(s.read_all(types=["test.rare", "test.other"])),
        ),
    ],
}
INDEX_NAMES = {
    ("position",): ["events_pkey", "INTEGER PRIMARY KEY"],
    ("event_id",): ["uq_events_event_id", "sqlite_autoindex_events_1"],
    ("stream_id", "stream_version"): ["uq_events_stream_version", "sqlite_autoindex_events_2"],
    ("type", "position"): ["ix_events_type_position"],
}
RETRIED = "0b3f6f6e-3c55-4c55-9a4c-1d9f0e1a2b3c"


def _retried() -> NewEvent:
    return NewEvent("test.added", {"amount": 0}, event_id=RETRIED)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def big_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Store]:
    """2,001 events in 20 streams, 200 of them `test.rare`; statistics up to date. One per
    backend for the module: the tests only read it."""
    if request.param == "sqlite":
        urls: Iterator[str] = iter([f"sqlite:///{tmp_path_factory.mktemp('ix') / 'trm.db'}"])
    else:
        urls = _pg_schema_url()
    url = next(urls)
    with open_store(url, projections=TOTALS) as store:
        store.append("w:0", [_retried()])
        store.append_batch(
            [
                (
                    f"w:{n % 20}",
                    [NewEvent("test.rare", {"amount": 0}) if n % 10 == 7 else added(n)],
                    None,
                )
                for n in range(2000)
            ]
        )
        with store.write_transaction() as conn:
            conn.exec_driver_sql("ANALYZE events")
        yield store
    for _ in urls:  # drops the PostgreSQL schema
        pass


@contextmanager
def _captured(store: Store) -> Iterator[list[tuple[str, Any]]]:
    """The statements on the events table the store sends while the block runs."""
    sent: list[tuple[str, Any]] = []
    engine = store._backend.engine

    def note(_conn: object, _cursor: object, sql: str, params: Any, *_: object) -> None:
        if " FROM events" in sql and sql.lstrip().upper().startswith("SELECT"):
            sent.append((sql, params))

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", note)


def _plan(store: Store, sql: str, params: Any) -> str:
    raw = store._backend.engine.raw_connection()
    try:
        cursor = raw.cursor()
        if store.dialect == "sqlite":
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
            return "\n".join(str(row[-1]) for row in cursor.fetchall())
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
        return json.dumps(cursor.fetchone()[0])
    finally:
        raw.close()


def _index_columns(store: Store) -> set[tuple[str, ...]]:
    """The events table's indexes and unique constraints (by columns), and its primary key."""
    with store._backend.engine.connect() as conn:
        inspector = inspect(conn)
        found = {tuple(ix["column_names"]) for ix in inspector.get_indexes("events")}
        found |= {tuple(uq["column_names"]) for uq in inspector.get_unique_constraints("events")}
        found.add(tuple(inspector.get_pk_constraint("events")["constrained_columns"]))
    return found  # type: ignore[return-value]


def test_the_events_table_has_exactly_the_indexes_that_serve_a_query(big_store: Store) -> None:
    assert _index_columns(big_store) == set(SERVES)


CASES = [(columns, what, call) for columns, uses in SERVES.items() for what, call in uses]


@pytest.mark.parametrize(
    ("columns", "what", "call"), CASES, ids=[f"{'+'.join(c)}: {w}" for c, w, _ in CASES]
)
def test_each_index_serves_its_query(
    big_store: Store, columns: tuple[str, ...], what: str, call: Call
) -> None:
    with _captured(big_store) as sent:
        call(big_store)
    assert sent, f"{what} sent no read of the events table"
    plans = [_plan(big_store, sql, params) for sql, params in sent]
    names = INDEX_NAMES[columns]
    assert any(name in plan for plan in plans for name in names), (what, plans)
    for plan in plans:
        assert "SCAN events" not in plan and "Seq Scan" not in plan, (what, plan)


def test_the_newest_event_of_a_stream_reads_one_index_row(big_store: Store) -> None:
    with _captured(big_store) as sent:
        big_store.read_stream("w:3", backwards=True, limit=1)
    ((sql, params),) = sent
    plan = _plan(big_store, sql, params)
    if big_store.dialect == "sqlite":
        assert "USE TEMP B-TREE" not in plan, plan  # read in index order: LIMIT 1 stops at one
    else:
        (scan,) = _nodes(json.loads(plan)[0]["Plan"], "Index Scan Backward")
        assert scan["Actual Rows"] == 1, plan


def _nodes(node: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The plan nodes of `kind` ("Index Scan", "Index Scan Backward", ...) under `node`."""
    backward = " Backward" if node.get("Scan Direction") == "Backward" else ""
    found = [node] if node["Node Type"] + backward == kind else []
    for child in node.get("Plans", []):
        found += _nodes(child, kind)
    return found


def test_a_rare_type_reads_only_its_own_events(big_store: Store) -> None:
    with _captured(big_store) as sent:
        rare = list(big_store.read_all(types=["test.rare"]))
    assert len(rare) == 200
    for sql, params in sent:
        if "type =" not in sql:
            continue  # the head, for the cursor
        plan = _plan(big_store, sql, params)
        if big_store.dialect == "sqlite":
            range_scan = (
                "USING INDEX ix_events_type_position (type=? AND position>? AND position<?)"
            )
            assert range_scan in plan, plan
        else:
            scans = _nodes(json.loads(plan)[0]["Plan"], "Index Scan")
            scans += _nodes(json.loads(plan)[0]["Plan"], "Index Only Scan")
            assert sum(s["Actual Rows"] for s in scans if "type" in s.get("Index Cond", "")) <= 200


def _rows_read(store: Store, sql: str, params: Any) -> int:
    """How many rows PostgreSQL's scans of the events table read to answer `sql`."""
    plan = json.loads(_plan(store, sql, params))[0]["Plan"]
    kinds = ("Seq Scan", "Index Scan", "Index Scan Backward", "Index Only Scan", "Bitmap Heap Scan")
    return sum(
        node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
        for kind in kinds
        for node in _nodes(plan, kind)
    )


@pytest.mark.parametrize("behind", [1, 5, 50])
def test_a_prefix_read_near_the_head_reads_what_follows_the_cursor(
    big_store: Store, behind: int
) -> None:
    """A follower at the head (a subscription's wake-up) reads the events appended since, not
    every event the prefix ever had (a hostile review: 55x the unfiltered read on SQLite)."""
    head = big_store.head_position()
    with _captured(big_store) as sent:
        got = list(big_store.read_all(head - behind, stream_prefix="w:"))
    assert [e.position for e in got] == list(range(head - behind + 1, head + 1))
    (sql, params) = next((sql, p) for sql, p in sent if "stream_id" in sql)
    if big_store.dialect == "sqlite":
        assert "USING INTEGER PRIMARY KEY (rowid>? AND rowid<?)" in _plan(big_store, sql, params)
    else:
        assert _rows_read(big_store, sql, params) <= behind


def test_types_and_a_prefix_read_each_types_index_from_the_cursor(big_store: Store) -> None:
    """Each type's range of its index starts at the cursor (the hostile review found SQLite
    walking every event of the type from position 1, each batch)."""
    head = big_store.head_position()
    with _captured(big_store) as sent:
        got = list(big_store.read_all(head - 100, types=["test.rare"], stream_prefix="w:1"))
    assert all(e.type == "test.rare" and e.stream_id.startswith("w:1") for e in got)
    (sql, params) = next((sql, p) for sql, p in sent if "stream_id" in sql)
    if big_store.dialect == "sqlite":
        assert "(type=? AND position>? AND position<?)" in _plan(big_store, sql, params)
    else:
        assert _rows_read(big_store, sql, params) <= 100
