"""Rebuilds rename their scratch tables in: live names, indexes, readers' view, the collector.

Also: projections' writes on the driver (`upsert`, `update_rows`) store what SQLAlchemy stores.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Connection, MetaData, create_engine, insert, inspect, text, update

from tests.store.helpers import GcProbe, added
from trm_store import Store, open_store
from trm_store.connect import normalise_url
from trm_store.domain._common import update_rows, upsert
from trm_store.domain.run_log import RunLog
from trm_store.domain.runs import RunsProjection, read_predictions, run_info
from trm_store.projection_rebuild import paused_cyclic_gc
from trm_store.projections import registered_projections
from trm_store.schema import PROJECTION_STATE

ROOT = Path(__file__).resolve().parents[2]
RUN = "r1"
QUESTIONS = 2500
"""More than a rebuild's batch of 1000 events: the fill commits several times."""


def _record(store: Store) -> None:
    with RunLog(store, RUN, config={"model": "m"}, batch_size=500) as log:
        for i in range(QUESTIONS):
            log.record_prediction(
                f"q{i:05d}", unit_id="u", prediction="A", correct=i % 2 == 0, stop_reason="stop"
            )


def _tamper(store: Store) -> None:
    """Make the live table differ from a replay, so a reader can tell old from new."""
    with store.write_transaction() as conn:
        conn.execute(text("UPDATE predictions SET stop_reason = 'tampered'"))


def _stop_reasons(store: Store) -> set[str]:
    return {p["stop_reason"] for p in read_predictions(store, RUN)}


def _relations(conn: Connection) -> set[str]:
    """The names of every table, index and sequence of the store."""
    if conn.dialect.name == "sqlite":
        return set(conn.execute(text("SELECT name FROM sqlite_master")).scalars())
    query = text(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'i', 'S')"
    )
    return set(conn.execute(query).scalars())


def test_renamed_tables_keep_the_live_names_of_their_indexes_and_keys(store_url: str) -> None:
    with open_store(store_url) as store:
        _record(store)
        before = run_info(store, RUN), read_predictions(store, RUN)
        seen = []
        for _ in range(2):  # a second rebuild finds no name left taken by the first
            store.rebuild_projections()
            assert (run_info(store, RUN), read_predictions(store, RUN)) == before
            with store.write_transaction() as conn:
                seen.append(_relations(conn))
                assert not [name for name in seen[-1] if "__rebuild" in name]
                inspector = inspect(conn)
                for projection in registered_projections().values():
                    for table in projection.define(MetaData(), "").values():
                        declared = {i.name for i in table.indexes}
                        assert {i["name"] for i in inspector.get_indexes(table.name)} == declared
                        if conn.dialect.name == "postgresql":  # as CREATE TABLE names it
                            key = inspector.get_pk_constraint(table.name)["name"]
                            assert key == f"{table.name}_pkey"
        assert seen[0] == seen[1]


def test_readers_see_the_old_table_during_a_rebuild_and_the_new_one_after(
    store_url: str,
) -> None:
    with open_store(store_url) as store:
        _record(store)
        _tamper(store)
        during: list[set[str]] = []
        applied = store.rebuild_projections(
            only="runs", progress=lambda n: during.append(_stop_reasons(store))
        )
        assert applied == {"runs": QUESTIONS + 2}
        assert len(during) == 3 and all(seen == {"tampered"} for seen in during)
        assert _stop_reasons(store) == {"stop"}
        assert store.verify_projections() == []


def test_a_read_transaction_open_across_the_swap_keeps_its_snapshot(sqlite_url: str) -> None:
    """SQLite readers do not block the swap: one that began before it sees the old table whole.
    (PostgreSQL's swap waits for such a reader instead.)"""
    with open_store(sqlite_url) as store:
        _record(store)
        _tamper(store)
        with store.query("runs") as (conn, tables):
            stop_reason = tables["predictions"].c.stop_reason
            old = conn.execute(stop_reason.table.select().with_only_columns(stop_reason)).all()
            store.rebuild_projections(only="runs")
            again = conn.execute(stop_reason.table.select().with_only_columns(stop_reason)).all()
        assert again == old and {r.stop_reason for r in old} == {"tampered"}
        assert _stop_reasons(store) == {"stop"}


@pytest.mark.parametrize("enabled", [True, False])
def test_the_pause_turns_the_collector_off_and_leaves_it_as_it_was(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with paused_cyclic_gc():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
        with pytest.raises(RuntimeError, match="stopped"), paused_cyclic_gc():
            raise RuntimeError("stopped")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_a_library_rebuild_and_open_store_leave_the_collector_alone(sqlite_url: str) -> None:
    """The collector is process-wide, the application's: only `trm replay-projections` pauses it."""
    assert gc.isenabled()
    probe = GcProbe()
    with open_store(sqlite_url, projections={probe.name: probe}) as store:
        for i in range(30):
            store.append(f"s{i % 3}", [added(i)])
        store.rebuild_projections(progress=lambda _n: probe.seen.append(gc.isenabled()))
        assert store.verify_projections() == []
    with (
        open_store(sqlite_url, projections={probe.name: probe}) as store,
        store.write_transaction() as conn,  # as an interrupted rebuild leaves it
    ):
        conn.execute(update(PROJECTION_STATE).values(status="rebuilding"))
    with open_store(sqlite_url, projections={probe.name: probe}):  # rebuilds it on open
        pass
    assert len(probe.seen) > 30 and all(probe.seen)


def test_trm_replay_projections_pauses_the_collector_for_its_rebuild(sqlite_url: str) -> None:
    probe = GcProbe()
    with open_store(sqlite_url, projections={probe.name: probe}) as store:
        for i in range(30):
            store.append(f"s{i % 3}", [added(i)])
    for extra in ([], ["--verify"]):
        command = [sys.executable, "-m", "tests.store.workers", "cli-gc-probe"]
        done = subprocess.run(
            [*command, "replay-projections", "--db", sqlite_url, "--only", probe.name, *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        seen = [line for line in done.stderr.splitlines() if line.startswith("gc-enabled=")]
        assert seen and set(seen) == {"gc-enabled=False"}, done.stderr


def test_driver_writes_store_values_as_sqlalchemy_does(store_url: str) -> None:
    """Datetimes, booleans, JSON (None included) and NULLs: the same stored values, compared as
    the driver returns them."""
    started = datetime(2026, 3, 1, 12, 30, 0, 5, tzinfo=UTC)
    run = {
        "run_id": "r",
        "status": "running",
        "started_at": started,
        "finished_at": None,
        "config": None,
        "host": "h",
        "pid": 7,
        "reason": None,
        "error": None,
        "version": 1,
        "last_event_at": started,
        "predictions": 0,
    }
    prediction = {
        "run_id": "r",
        "question_id": "q",
        "seq": 2,
        "unit_id": "u",
        "prediction": {"b": [1, 2.5, None], "a": "é"},
        "correct": False,
        "stop_reason": "stop",
        "fields": {"tokens": 3},
    }
    ended = {"run_id": "r", "status": "completed", "finished_at": started, "version": 3}
    by_driver = RunsProjection().define(MetaData(), "_by_driver")
    by_sqlalchemy = RunsProjection().define(MetaData(), "_by_sqlalchemy")
    with open_store(store_url, projections={}) as store, store.write_transaction() as conn:
        for table in [*by_driver.values(), *by_sqlalchemy.values()]:
            table.create(conn)
        upsert(conn, by_driver["runs"], [run], keys=("run_id",), update=("status",))
        keys = ("run_id", "question_id")
        upsert(conn, by_driver["predictions"], [prediction], keys=keys, update=("seq",))
        update_rows(conn, by_driver["runs"], [ended], keys=("run_id",))
        conn.execute(insert(by_sqlalchemy["runs"]).values(run))
        conn.execute(insert(by_sqlalchemy["predictions"]).values(prediction))
        runs = by_sqlalchemy["runs"]
        conn.execute(update(runs).where(runs.c.run_id == "r").values(ended))
        for logical in ("runs", "predictions"):
            rows = [
                conn.exec_driver_sql(f"SELECT * FROM {tables[logical].name}").all()
                for tables in (by_driver, by_sqlalchemy)
            ]
            assert rows[0] == rows[1] and len(rows[0]) == 1


def test_an_upsert_replaces_only_the_columns_it_names(store_url: str) -> None:
    runs = RunsProjection().define(MetaData(), "_upserted")["predictions"]
    row = {
        "run_id": "r",
        "question_id": "q",
        "seq": 1,
        "unit_id": "u",
        "prediction": "A",
        "correct": True,
        "stop_reason": "stop",
        "fields": {},
    }
    with open_store(store_url, projections={}) as store, store.write_transaction() as conn:
        runs.create(conn)
        upsert(conn, runs, [row], keys=("run_id", "question_id"), update=("prediction",))
        again = {**row, "seq": 9, "prediction": "B"}
        last = {**row, "seq": 9, "prediction": None}
        upsert(conn, runs, [again, last], keys=("run_id", "question_id"), update=("prediction",))
        stored = conn.execute(runs.select()).one()
    assert (stored.seq, stored.prediction) == (1, None)  # last row per key wins, seq is kept


def test_a_postgresql_reader_is_never_shown_the_swapped_in_table_empty(pg_url: str) -> None:
    """A query's snapshot is taken under a lock on the projection's tables: a swap that wants
    them waits for the reader, who sees the old rows whole instead of a new table whose rows
    committed after its snapshot (to it, an empty table)."""
    with open_store(pg_url) as store:
        _record(store)
        _tamper(store)
        rebuild = threading.Thread(target=store.rebuild_projections, kwargs={"only": "runs"})
        with store.query("runs") as (conn, tables):
            rebuild.start()
            _wait_for(lambda: not rebuild.is_alive() or _waiting_on_a_table_lock(pg_url))
            predictions = tables["predictions"]
            rows = conn.execute(predictions.select().with_only_columns(predictions.c.stop_reason))
            seen = [r.stop_reason for r in rows]
        rebuild.join(timeout=60)
        assert not rebuild.is_alive()
        assert len(seen) == QUESTIONS and set(seen) == {"tampered"}
        assert _stop_reasons(store) == {"stop"}


def _waiting_on_a_table_lock(url: str) -> bool:
    """Whether a session of this database waits for a table's lock (the rebuild's swap).

    Asked on a connection of its own: a store transaction would queue behind the rebuild."""
    engine = create_engine(normalise_url(url))
    try:
        with engine.connect() as conn:
            query = text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND wait_event = 'relation'"
            )
            return bool(conn.execute(query).scalar_one())
    finally:
        engine.dispose()


def _wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
