"""The projections' epoch (`trm_store.schema.PROJECTION_EPOCH`, migration 0006): every statement
that writes `projection_state` moves it, whoever sends it; an append that knows it reads no
projection's row; and a change made by another store is still seen by the next append."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, create_engine, text

from tests.store.helpers import TOTALS, NamedTotals, added, replayed_totals, totals
from tests.store.interrupt_places import LIMIT, InterruptAt, outcome_of, traced_by
from trm_store import StoreError, open_store, projection_runner
from trm_store.append_heads import NO_EPOCH, heads
from trm_store.schema import FOLLOWING

TWO = {**TOTALS, "test_other": NamedTotals("test_other")}

_WRITES = {
    "insert": "INSERT INTO projection_state (name, version, checkpoint, status, updated_at)"
    " VALUES ('test_new', 1, 0, 'ready', CURRENT_TIMESTAMP) ON CONFLICT (name) DO NOTHING",
    "version": "UPDATE projection_state SET version = version + 1 WHERE name = 'test_other'",
    "checkpoint": "UPDATE projection_state SET checkpoint = 0 WHERE name = 'test_totals'",
    "status": "UPDATE projection_state SET status = 'rebuilding'",
    "same values": "UPDATE projection_state SET version = version",
    "delete": "DELETE FROM projection_state WHERE name = 'test_new'",
}


def _epoch(conn: Connection) -> int:
    return int(conn.execute(text("SELECT epoch FROM projection_epoch")).scalar_one())


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(writes=st.lists(st.sampled_from(sorted(_WRITES)), min_size=1, max_size=6))
def test_every_write_to_projection_state_moves_the_epoch(store_url: str, writes: list[str]) -> None:
    """A statement that changes no row may move it or not; one that changes a row always does."""
    with open_store(store_url, projections=TWO) as store:
        with store._reading() as conn:
            seen = {_epoch(conn)}
        for write in writes:
            with store.write_transaction() as conn:
                changed = conn.execute(text(_WRITES[write])).rowcount
                epoch = _epoch(conn)
            if changed:
                assert epoch not in seen, write
            seen.add(epoch)
        with store._reading() as conn:
            conn.execute(text("SELECT * FROM projection_state")).all()
            assert _epoch(conn) == epoch  # a read leaves it
    assert epoch >= 0 and NO_EPOCH == -1  # an append that knows none never finds it


def test_the_epoch_starts_at_a_random_value(tmp_path: Any) -> None:
    """Two databases do not share an epoch: a store whose file is swapped for another one
    does not take that one's rows for those it knew."""
    epochs = set()
    for k in range(3):
        url = f"sqlite:///{tmp_path / f'{k}.db'}"
        with open_store(url, projections={}) as store, store._reading() as conn:
            epochs.add(_epoch(conn))
    assert len(epochs) == 3


def test_an_append_that_knows_the_epoch_reads_no_projection_row(store_url: str) -> None:
    with open_store(store_url, projections=TWO) as store:
        store.append("a", [added(1)])
        store.append("a", [added(2)])
        with store.write_transaction() as conn:
            current = _epoch(conn)
            unknown = heads(conn, "a", NO_EPOCH)
            known = heads(conn, "a", current)
        assert store._projections.known_epoch == current
    assert (unknown.log_head, unknown.stream_version, unknown.epoch) == (2, 2, current)
    assert sorted((r[3], r[5]) for r in unknown.checkpoints) == [
        ("test_other", FOLLOWING),
        ("test_totals", FOLLOWING),
    ]
    assert known == (2, 2, current, ())


class _OtherV2(NamedTotals):
    version = 2


def _table(store: Any, name: str) -> list[Any]:
    with store._reading() as conn:
        return sorted(tuple(row) for row in conn.execute(text(f"SELECT * FROM {name}")))


def test_a_change_by_another_store_is_seen_by_the_next_append(store_url: str) -> None:
    """The first store knows the epoch; another one (another process's, as far as the first
    can tell) rebuilds a projection at another version. The first store's next append reads
    the rows again and leaves that projection alone: without the epoch's move it would go on
    applying its events to the table the other version rebuilt."""
    with open_store(store_url, projections=TWO) as first:
        first.append("a", [added(1)])
        first.append("a", [added(2)])
        known = first._projections.known_epoch
        other = {**TOTALS, "test_other": _OtherV2("test_other")}
        with open_store(store_url, projections=other) as second:
            assert second.projection_status()["test_other"].version == 2
            rebuilt = _table(second, "test_other")
        first.append("a", [added(3)])
        assert first._projections.known_epoch != known
        assert totals(first) == replayed_totals(first)
        assert _table(first, "test_other") == rebuilt


def test_the_triggers_name_their_own_schema_on_postgresql(pg_url: str) -> None:
    """A session whose search_path leads elsewhere writes `<schema>.projection_state`: the
    epoch of that schema moves (the trigger does not look for the table on the path)."""
    with open_store(pg_url, projections=TWO) as store, store._reading() as conn:
        schema = conn.execute(text("SELECT current_schema()")).scalar_one()
        before = _epoch(conn)
    engine = create_engine(pg_url.split("?")[0])
    try:
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL search_path TO pg_catalog"))
            conn.execute(text(f'UPDATE "{schema}".projection_state SET version = version + 1'))
    finally:
        engine.dispose()
    with open_store(pg_url, projections={}) as store, store._reading() as conn:
        assert _epoch(conn) != before


@pytest.mark.parametrize("projections", [{}, TWO])
def test_appends_with_and_without_projections_agree_with_a_replay(
    store_url: str, projections: dict[str, Any]
) -> None:
    with open_store(store_url, projections=projections) as store:
        for k in range(1, 6):
            store.append("a", [added(k)])
        if projections:
            assert totals(store) == replayed_totals(store)
        server_numbered = store.dialect == "postgresql" and not projections  # no heads read
        with store._reading() as conn:
            assert store._projections.known_epoch == (NO_EPOCH if server_numbered else _epoch(conn))


def test_an_append_refuses_to_write_once_the_epoch_row_is_gone(store_url: str) -> None:
    """Deleted outside trm, the row could no longer tell an append that the projections' rows
    changed: the append is refused with a typed error and writes nothing."""
    with open_store(store_url, projections=TWO) as store:
        store.append("a", [added(1)])
        with store.write_transaction() as conn:
            conn.execute(text("DELETE FROM projection_epoch"))
        with pytest.raises(StoreError, match="projection_epoch is gone"):
            store.append("a", [added(2)])
        assert [e.version for e in store.read_stream("a")] == [1]


def _epoch_of(store: Any) -> int:
    with store._reading() as conn:
        return _epoch(conn)


def _sqlite_copy(source: Path, target: Path) -> None:
    """SQLite's online backup API: what `sqlite3 live.db '.restore backup.db'` does."""
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


def test_a_restored_backup_written_again_does_not_come_back_to_the_known_epoch(
    tmp_path: Path,
) -> None:
    """A backup restored under an open store, then written as often as the live database was
    since the backup: were the epoch a counter, it would be back at the number the store knows,
    with other rows behind it."""
    live, backup = tmp_path / "live.db", tmp_path / "backup.db"
    touch = text("UPDATE projection_state SET updated_at = updated_at WHERE name = 'test_totals'")
    with open_store(f"sqlite:///{live}", projections=TWO) as first:
        first.append("a", [added(1)])  # the rows begin to follow: changed, nothing known yet
        _sqlite_copy(live, backup)
        for _ in range(3):
            with first.write_transaction() as conn:
                conn.execute(touch)
        first.append("a", [added(2)])  # decides, and knows the epoch
        known = first._projections.known_epoch
        assert known == _epoch_of(first)
        _sqlite_copy(backup, live)
        with open_store(f"sqlite:///{live}", projections=TWO) as other:
            for _ in range(3):
                with other.write_transaction() as conn:
                    conn.execute(touch)
            assert _epoch_of(other) != known


def _pg_schema(store: Any) -> str:
    with store._reading() as conn:
        return str(conn.execute(text("SELECT current_schema()")).scalar_one())


def test_a_write_as_a_replica_moves_the_epoch_on_postgresql(pg_url: str) -> None:
    """A logical replication worker, or `SET session_replication_role = replica`, runs no
    ordinary trigger: the epoch's are `ENABLE ALWAYS`, so the open store still sees the row
    another version set, and moves the log past it instead of applying it."""
    with open_store(pg_url, projections=TWO) as store:
        store.append("a", [added(1)])
        store.append("a", [added(2)])
        schema = _pg_schema(store)
        engine = create_engine(pg_url.split("?")[0])
        try:
            with engine.begin() as conn:
                conn.execute(text("SET LOCAL session_replication_role = replica"))
                conn.execute(
                    text(
                        f'UPDATE "{schema}".projection_state SET version = 2'
                        " WHERE name = 'test_other'"
                    )
                )
        finally:
            engine.dispose()
        before = _table(store, "test_other")
        store.append("a", [added(3)])
        assert _table(store, "test_other") == before
        with store._reading() as conn:
            row = conn.execute(
                text("SELECT version, checkpoint FROM projection_state WHERE name = 'test_other'")
            ).one()
        assert tuple(row) == (2, 2)  # set to the head it reached, no longer following


def _in_a_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(outcome_of(call)))
    thread.start()
    return thread, outcome


def _yours_and_an_append(store: Any, pg_url: str, first: str, then: str) -> list[object]:
    """Your transaction (another connection) runs `first`; an append begins and must wait for
    it; your transaction runs `then` and commits: what the append returned or raised."""
    engine = create_engine(pg_url.split("?")[0])
    try:
        with engine.connect() as yours:
            yours.execute(text(first))
            append, outcome = _in_a_thread(lambda: store.append("a", [added(3)]))
            append.join(0.5)
            assert append.is_alive()  # waiting for your transaction
            yours.execute(text(then))
            yours.commit()
        append.join(LIMIT)
    finally:
        engine.dispose()
    return outcome


def test_a_transaction_of_yours_on_projection_state_cannot_deadlock_an_append(
    pg_url: str,
) -> None:
    """Your transaction writes one projection's row; an append that must mark another one as
    following waits for it (the epoch's row, which your first statement took), and your second
    statement, on the row the append wants, goes on: both commit, neither is aborted."""
    with open_store(pg_url, projections=TWO) as store:
        store.append("a", [added(1)])
        store.append("a", [added(2)])
        with store.write_transaction() as conn:  # caught up: the next append marks it following
            conn.execute(_AT_THE_HEAD, {"name": "test_other"})
        touched = f'UPDATE "{_pg_schema(store)}".projection_state SET updated_at = now()'
        outcome = _yours_and_an_append(
            store,
            pg_url,
            f"{touched} WHERE name = 'test_totals'",
            f"{touched} WHERE name = 'test_other'",
        )
        assert [type(o) for o in outcome] == [list], outcome
        assert totals(store) == replayed_totals(store)


def test_a_repair_of_a_projection_row_cannot_deadlock_an_append(pg_url: str) -> None:
    """Your transaction fixes a projection's table row, then touches `projection_state`; an
    append that applies to that table row meanwhile waits for it (holding trm's append lock),
    and your second statement must not wait for the append: it takes no lock of trm's."""
    with open_store(pg_url, projections=TWO) as store:
        store.append("a", [added(1)])
        store.append("a", [added(2)])  # the epoch known: the next append reads no row
        schema = _pg_schema(store)
        outcome = _yours_and_an_append(
            store,
            pg_url,
            f"UPDATE \"{schema}\".test_totals SET total = total WHERE stream_id = 'a'",
            f'UPDATE "{schema}".projection_state SET updated_at = now()'
            " WHERE name = 'test_totals'",
        )
        assert [type(o) for o in outcome] == [list], outcome
        assert totals(store) == replayed_totals(store)


def test_a_truncate_of_projection_state_cannot_deadlock_a_writer(pg_url: str) -> None:
    """`TRUNCATE projection_state` locks the whole table, then its trigger moves the epoch; a
    writer of the store holding trm's append lock (as a catch-up or a rebuild's swap does) and
    reading `projection_state` meanwhile waits for it, and it does not wait for the writer."""
    with open_store(pg_url, projections=TWO) as store:
        store.append("a", [added(1)])
        schema = _pg_schema(store)
        engine = create_engine(pg_url.split("?")[0])

        def truncate() -> None:
            with engine.begin() as conn:
                conn.execute(text(f'TRUNCATE "{schema}".projection_state'))

        try:
            with store.write_transaction() as conn:
                truncating, outcome = _in_a_thread(truncate)
                truncating.join(0.5)
                assert conn.execute(text("SELECT count(*) FROM projection_state")).scalar_one() == 0
            truncating.join(LIMIT)
        finally:
            engine.dispose()
        assert outcome == [None], outcome


_AT_THE_HEAD = text(
    "UPDATE projection_state SET checkpoint = (SELECT max(position) FROM events) WHERE name = :name"
)


def _interrupted_while_deciding(store: Any, at: int) -> InterruptAt:
    """An append that decides who follows (its epoch is not the one known), interrupted at the
    `at`-th place of the projections' code (`trm_store.projection_runner`): where a Ctrl-C can
    land while `follow` decides, writes and remembers, and while the events are applied."""
    tracer = InterruptAt(at, traced={projection_runner.__file__}, own_starts=True)
    with traced_by(tracer):
        store.append("a", [added(10)])
    return tracer


def test_an_interrupt_while_deciding_leaves_the_next_append_right(tmp_path: Path) -> None:
    """At each place in turn: another version rebuilt `test_other`, so this store must stop
    applying it, and `test_third` caught up to the head, so it must start. Whatever an
    interrupt cut short, the next append applies exactly the projections that follow."""
    three = {**TWO, "test_third": NamedTotals("test_third")}
    for at in range(1, 400):
        url = f"sqlite:///{tmp_path / f'{at}.db'}"
        with open_store(url, projections=three) as store:
            store.append("a", [added(1)])
            store.append("a", [added(2)])  # known: all three follow
            with store.write_transaction() as conn:  # stopped following, at the head
                conn.execute(_AT_THE_HEAD, {"name": "test_third"})
            with open_store(url, projections={**three, "test_other": _OtherV2("test_other")}):
                pass  # rebuilt at version 2 by "another process"
            rebuilt = _table(store, "test_other")
            tracer = _interrupted_while_deciding(store, at)
            store.append("a", [added(20)])
            assert _table(store, "test_other") == rebuilt, at
            assert totals(store) == replayed_totals(store), at
            events = store.read_stream("a")
            whole = ("a", sum(e.data["amount"] for e in events), len(events), events[-1].position)
            assert _table(store, "test_third") == [whole], at
            with store._reading() as conn:
                rows = conn.execute(text("SELECT name, version, checkpoint FROM projection_state"))
                stored = {name: (version, checkpoint) for name, version, checkpoint in rows}
            assert stored == {
                "test_totals": (1, FOLLOWING),
                "test_other": (2, 2),
                "test_third": (1, FOLLOWING),
            }, at
        if tracer.places < at:
            break
    else:
        pytest.fail("the runs never reached the end of the append")
    assert at > 10
