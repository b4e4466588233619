"""A PostgreSQL store works whatever session defaults the server, the database, the role or the
URL set (`trm_store.postgres_session`): dates in another style (psycopg parses ISO only: every
read failed with its NotImplementedError) and another time zone (`recorded_at` came back in it,
not in UTC as from SQLite). Set here through the URL's options, as a role's or a database's
defaults would be, without touching the shared database."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import suppress
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import PG_URL, _pg_schema_url
from tests.store.helpers import TOTALS, Totals, added
from trm_store import NewEvent, RunLog, StoreError, open_store
from trm_store.domain.runs import run_info
from trm_store.postgres_warm import WARM_FOR

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize(
    "options",
    [
        "-cDateStyle%3DSQL,DMY",
        "-cDateStyle%3DGerman",
        "-cDateStyle%3DPostgres,MDY%20-cTimeZone%3DAsia/Kolkata",
        "-cTimeZone%3DAmerica/St_Johns",
    ],
)
def test_events_and_read_models_read_back_in_utc_whatever_the_session_defaults(
    pg_url: str, options: str
) -> None:
    with open_store(f"{pg_url}%20{options}", projections=None) as store:
        recorded = store.append("s", [added(1), added(2)])
        read = list(store.read_all())
        assert read == recorded
        assert {e.recorded_at.utcoffset() for e in read} == {timedelta(0)}
        assert [e.recorded_at.isoformat() for e in read] == [
            e.recorded_at.isoformat() for e in recorded
        ]
        with RunLog(store, "r1", config={"k": 1}) as run:
            run.record_prediction(
                "q1", unit_id="u1", prediction="A", correct=True, stop_reason="stop"
            )
        info = run_info(store, "r1")
        assert info["status"] == "completed"
        assert info["started_at"].utcoffset() == timedelta(0)
        assert store.verify_projections() == []


@pytest.mark.parametrize(
    "setting", ["SET TimeZone = 'Asia/Tokyo'", "SET DateStyle = 'SQL, DMY'", "SET TIME ZONE 9"]
)
@pytest.mark.parametrize("where", ["query", "write_transaction"])
def test_a_setting_a_caller_sends_does_not_reach_the_stores_next_reads(
    pg_url: str, setting: str, where: str
) -> None:
    """A caller's SQL in `query()` or `write_transaction()` may change its session; what it
    commits stays on the pooled connection. The next use of that connection gets the store's
    settings back: every read still parses its dates, in UTC."""
    with open_store(pg_url, projections=None) as store:
        store.append("s", [added(1), added(2)])
        name = store.projection_names[0]
        for _ in range(3):  # the pool's connections, each set in turn
            if where == "query":
                with store.query(name) as (conn, _tables):
                    conn.exec_driver_sql(setting)
            else:
                with store.write_transaction() as conn:
                    conn.exec_driver_sql(setting)
            read = list(store.read_all()) + store.read_stream("s")
            assert {e.recorded_at.utcoffset() for e in read} == {timedelta(0)}


@pytest.fixture
def second_schema() -> Iterator[str]:
    """Another store's schema on the same database, with a log of its own."""
    yield from _pg_schema_url()


def _schema_of(url: str) -> str:
    return url.rsplit("%3D", 1)[1]


@pytest.mark.parametrize("where", ["query", "write_transaction"])
def test_a_search_path_a_caller_sets_never_sends_the_store_to_another_schema(
    pg_url: str, second_schema: str, where: str
) -> None:
    """A second review: after `SET search_path = <another store's schema>` in `query()`, the
    store read the other log; after one in `write_transaction()`, it appended to it."""
    with (
        open_store(pg_url, projections=TOTALS) as ours,
        open_store(second_schema, projections=TOTALS) as theirs,
    ):
        ours.append("ours", [added(1)])
        theirs.append("theirs", [added(2)])
        other = _schema_of(second_schema)
        for _ in range(5):  # the pool's or the writers' connections, each in turn
            if where == "query":
                with ours.query("test_totals") as (conn, _tables):
                    conn.exec_driver_sql(f'SET search_path = "{other}"')
            else:
                with ours.write_transaction() as conn:
                    conn.exec_driver_sql(f'SET search_path = "{other}"')
            ours.append("ours", [added(1)])
        assert {e.stream_id for e in ours.read_all()} == {"ours"}
        assert [e.stream_id for e in theirs.read_all()] == ["theirs"]


@pytest.mark.parametrize("setting", ["SET TimeZone = 'Asia/Tokyo'", "SET DateStyle = 'SQL, DMY'"])
def test_a_setting_sent_in_a_write_transaction_does_not_reach_the_next_one(
    pg_url: str, setting: str
) -> None:
    """Writer connections are not the pool's: no checkout sees them (a second review)."""
    with open_store(pg_url, projections=None) as store:
        store.append("s", [added(1)])
        for _ in range(5):
            with store.write_transaction() as conn:
                conn.exec_driver_sql(setting)
            with store.write_transaction() as conn:
                (at,) = conn.execute(text("SELECT recorded_at FROM events LIMIT 1")).one()
                assert at.utcoffset() == timedelta(0)


class _SettingTotals(Totals):
    """`Totals`, whose `apply` also sends a session setting (an amount of 99 says when)."""

    setting = ""

    def apply(self, conn: Any, tables: Any, events: Any) -> None:
        super().apply(conn, tables, events)
        if any(e.data["amount"] == 99 for e in events):
            conn.exec_driver_sql(self.setting)


@pytest.mark.parametrize("what", ["search_path", "DateStyle"])
def test_a_setting_a_projections_apply_sends_does_not_reach_the_next_transactions(
    pg_url: str, second_schema: str, what: str
) -> None:
    """A third review: after `apply` set a search_path, the store's later appends went into
    another store's log; after a DateStyle, a `write_transaction` reading a date failed with
    psycopg's raw NotImplementedError. A writer connection whose transaction ran a caller's SQL
    begins its next one by restoring the session (`trm_store.postgres_writers`)."""
    projection = _SettingTotals()
    other = _schema_of(second_schema)
    projection.setting = (
        f'SET search_path = "{other}"' if what == "search_path" else "SET DateStyle = 'SQL, DMY'"
    )
    with open_store(second_schema, projections=TOTALS) as theirs:
        theirs.append("theirs", [added(2)])
    with open_store(pg_url, projections={"test_totals": projection}) as ours:
        for n in range(6):  # the writer connections, each in turn
            ours.append("ours", [added(99)])
            ours.append(f"ours{n}", [added(1)])
            with ours.write_transaction() as conn:
                (at,) = conn.execute(text("SELECT recorded_at FROM events LIMIT 1")).one()
                assert at.utcoffset() == timedelta(0)
        assert len(list(ours.read_all())) == 12
    with open_store(second_schema, projections=TOTALS) as theirs:
        assert [e.stream_id for e in theirs.read_all()] == ["theirs"]


def _noted(n: int) -> NewEvent:
    """An event no test projection takes: appended server-numbered, in one or two queries."""
    return NewEvent("test.noted", {"amount": n})


def test_a_restore_rolled_back_is_owed_again(pg_url: str, second_schema: str) -> None:
    """A fourth review: the restore is part of the transaction it begins; when that transaction
    rolled back (a server-numbered append's second query refused by lock_timeout while another
    session held a SHARE lock), the RESET was undone and the mark gone, and the next append went
    into another store's log. The mark now stays until a transaction carrying the restore
    commits."""
    projection = _SettingTotals()
    projection.setting = f'SET search_path = "{_schema_of(second_schema)}"'
    with open_store(second_schema, projections=TOTALS) as theirs:
        theirs.append("theirs", [added(2)])
    admin = create_engine(PG_URL)
    with open_store(
        f"{pg_url}%20-clock_timeout%3D300", projections={"test_totals": projection}
    ) as ours:
        ours.append("ours", [added(99)])  # the apply sets the search_path; committed
        time.sleep(WARM_FOR + 0.3)  # no longer warm: the append takes two queries
        with admin.connect() as blocker:
            blocker.execute(text(f'LOCK TABLE "{_schema_of(pg_url)}".events IN SHARE MODE'))
            with pytest.raises(StoreError):
                ours.append("n", [_noted(1)])
            blocker.rollback()
        ours.append("ours", [added(1)])
        assert [e.stream_id for e in ours.read_all()] == ["ours", "ours"]
    admin.dispose()
    with open_store(second_schema, projections=TOTALS) as theirs:
        assert [e.stream_id for e in theirs.read_all()] == ["theirs"]


def test_a_statement_is_prepared_under_the_stores_own_search_path(
    pg_url: str, second_schema: str
) -> None:
    """A fourth review: `PREPARE` of the server-numbered insert ran before the restore, under a
    search_path an apply had set (here a schema without trm's tables): every such append
    failed. The restore is sent first, on its own, when a statement is to be prepared."""
    projection = _SettingTotals()
    empty = f"empty_{_schema_of(second_schema)}"
    projection.setting = f'SET search_path = "{empty}"'
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{empty}"'))
    try:
        with open_store(pg_url, projections={"test_totals": projection}) as ours:
            for n in range(4):
                ours.append("ours", [added(99)])
                ours.append(f"noted{n}", [_noted(n)])
            assert len(list(ours.read_all())) == 8
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{empty}" CASCADE'))
        admin.dispose()


_ENDINGS = {
    "conn.commit()": lambda conn: conn.commit(),
    "SQL COMMIT": lambda conn: conn.exec_driver_sql("COMMIT"),
    "COMMIT AND CHAIN": lambda conn: conn.exec_driver_sql("COMMIT AND CHAIN"),
    "COMMIT, then a statement": lambda conn: conn.exec_driver_sql("COMMIT; SELECT 1"),
    "conn.close()": lambda conn: conn.close(),
    "conn.invalidate()": lambda conn: conn.invalidate(),
}


class _Raised(Exception):
    pass


@pytest.mark.parametrize("raises", [False, True], ids=["ends", "then-raises"])
@pytest.mark.parametrize("how", sorted(_ENDINGS))
def test_a_query_block_that_ends_its_transaction_leaves_nothing_behind(
    pg_url: str, second_schema: str, how: str, raises: bool
) -> None:
    """The fourth and fifth reviews: a SQL `COMMIT` (alone, chained, or followed by another
    statement) ended the transaction where the check at the block's end could not see it, and
    a block that raised skipped the check: the connection went back to the pool with the
    block's search_path. Blocks that closed or invalidated their connection got a StoreError.
    Every connection a `query()` block ran on is restored as it goes back to the pool."""
    with (
        open_store(pg_url, projections=TOTALS) as ours,
        open_store(second_schema, projections=TOTALS) as theirs,
    ):
        ours.append("ours", [added(1)])
        theirs.append("theirs", [added(2), added(3)])
        for _ in range(5):
            with suppress(_Raised), ours.query("test_totals") as (conn, _tables):
                conn.exec_driver_sql(f'SET search_path = "{_schema_of(second_schema)}"')
                _ENDINGS[how](conn)
                if raises:
                    raise _Raised
            assert [e.stream_id for e in ours.read_all()] == ["ours"]
            assert ours.head_position() == 1


def test_a_read_only_query_chained_past_its_commit_leaves_nothing_behind(
    pg_url: str, second_schema: str
) -> None:
    """The guard lets `COMMIT AND CHAIN` through (the chained transaction is read-only too);
    the search_path set before it was committed (a fifth review)."""
    with open_store(pg_url, projections=TOTALS) as ours:
        ours.append("ours", [added(1)])
    with open_store(second_schema, projections=TOTALS) as theirs:
        theirs.append("theirs", [added(2), added(3)])
    with open_store(pg_url, projections=TOTALS, read_only=True) as reader:
        for _ in range(5):
            with suppress(StoreError), reader.query("test_totals") as (conn, _tables):
                conn.exec_driver_sql(f'SET search_path = "{_schema_of(second_schema)}"')
                conn.exec_driver_sql("COMMIT AND CHAIN")
            assert [e.stream_id for e in reader.read_all()] == ["ours"]


@pytest.fixture
def powerless_role() -> Iterator[str]:
    """A role of this test's own, with no rights on any store's schema (dropped after)."""
    name = f"trm_powerless_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE ROLE "{name}"'))
        conn.execute(text(f'GRANT "{name}" TO CURRENT_USER'))
    try:
        yield name
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP ROLE "{name}"'))
        admin.dispose()


@pytest.mark.parametrize("what", ["temp table", "SET ROLE"])
@pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
def test_what_a_query_block_commits_does_not_outlive_it(
    pg_url: str, powerless_role: str, what: str, read_only: bool
) -> None:
    """A sixth review: only three settings were restored; a temp table named `events` that a
    block committed hid the store's log from later reads, and a committed `SET ROLE` to a role
    without rights broke every later read. The whole session is made fresh now."""
    with open_store(pg_url, projections=TOTALS) as writer:
        writer.append("ours", [added(1)])
    sql = {
        "temp table": f'CREATE TEMP TABLE events (LIKE "{_schema_of(pg_url)}".events)',
        "SET ROLE": f'SET ROLE "{powerless_role}"',
    }[what]
    with open_store(pg_url, projections=TOTALS, read_only=read_only) as store:
        for _ in range(5):
            with suppress(StoreError), store.query("test_totals") as (conn, _tables):
                if what == "temp table" and read_only:
                    sql_here = "SET search_path = pg_temp"  # a read-only store makes no table
                else:
                    sql_here = sql
                conn.exec_driver_sql(sql_here)
                conn.exec_driver_sql("COMMIT AND CHAIN")
            assert [e.stream_id for e in store.read_all()] == ["ours"]
            with store.query("test_totals") as (conn, _tables):
                assert conn.exec_driver_sql("SELECT current_user").scalar() != powerless_role
