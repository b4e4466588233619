"""Checkpoints that follow the log (`trm_store.schema.FOLLOWING`): a projection of this code, at
its version and at the log's head, follows the log from its next append on, which then writes
no `projection_state` row at all; code that does not run it sets it to the head it reached; a
reader sees a position, never the marker; and the migration that brought the marker in goes
both ways."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from alembic import command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, event, select, text, update

from tests.store.helpers import TOTALS, NamedTotals, added, replayed_totals, totals
from trm_store import ConcurrencyError, StoreError, open_store
from trm_store.append_heads import AppendHeads
from trm_store.migrate import alembic_config
from trm_store.projection_runner import ProjectionSet
from trm_store.schema import FOLLOWING, PROJECTION_STATE

THREE = {**TOTALS, "test_other": NamedTotals("test_other"), "test_third": NamedTotals("test_third")}


def _stored(url: str) -> Mapping[str, tuple[int, int]]:
    """Each row's version and checkpoint as stored (the marker included)."""
    with open_store(url, read_only=True, projections={}) as store, store._reading() as conn:
        return {r.name: (r.version, r.checkpoint) for r in conn.execute(select(PROJECTION_STATE))}


def _read(url: str) -> Mapping[str, tuple[int, int]]:
    """Each row's version and checkpoint as readers see it (a position)."""
    with open_store(url, read_only=True, projections={}) as store:
        return {n: (s.version, s.checkpoint) for n, s in store.projection_status().items()}


def test_only_projections_of_this_code_at_the_head_follow_the_log(store_url: str) -> None:
    with open_store(store_url, projections={**THREE, "test_fourth": NamedTotals("test_fourth")}):
        pass  # a projection that the code below does not have
    with open_store(store_url, projections=THREE) as store:
        store.append("a", [added(1)])
        with store.write_transaction() as conn:  # one at another version, one behind the head
            rows = PROJECTION_STATE.c
            conn.execute(
                update(PROJECTION_STATE).where(rows.name == "test_other").values(version=9)
            )
            conn.execute(
                update(PROJECTION_STATE).where(rows.name == "test_third").values(checkpoint=0)
            )
        store.append("a", [added(2), added(3)])
        store.append_batch([("b", [added(4)], None), ("c", [added(5)], 0)])
        with pytest.raises(ConcurrencyError):  # refused after the heads' read: writes nothing
            store.append("c", [added(6)], expected_version=0)
        assert totals(store) == replayed_totals(store)
    assert _read(store_url) == {
        "test_totals": (1, 5),
        "test_other": (9, 1),  # it followed the log until code at version 1 appended
        "test_third": (1, 0),
        "test_fourth": (1, 0),
    }
    assert _stored(store_url)["test_totals"] == (1, FOLLOWING)


def _row_versions(conn: Any, dialect: str) -> list[Any]:
    """A token of each row's physical version: PostgreSQL's `xmin` (the transaction that wrote
    it), SQLite's rowid and values (an UPDATE on SQLite rewrites in place: the statements sent
    are checked instead)."""
    if dialect == "postgresql":
        return list(conn.execute(text("SELECT name, xmin::text FROM projection_state ORDER BY 1")))
    return list(conn.execute(text("SELECT rowid, * FROM projection_state ORDER BY 1")))


def test_an_append_writes_no_projection_row_while_they_follow_the_log(store_url: str) -> None:
    """Before, every append moved every current projection's checkpoint with an UPDATE (on
    PostgreSQL inside the heads' read, ~40% of the server's instructions of a 1-event append)."""
    with open_store(store_url, projections=THREE) as store:
        store.append("a", [added(1)])  # the rows begin to follow the log
        sent: list[str] = []

        @event.listens_for(store._backend.engine, "before_cursor_execute")
        def _seen(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
            sent.append(sql)

        with store._reading() as conn:
            before = _row_versions(conn, store.dialect)
        store.append("a", [added(2)])
        store.append_batch([("b", [added(3)], None), ("c", [added(4), added(5)], 0)])
        with store._reading() as conn:
            assert _row_versions(conn, store.dialect) == before
        assert not [s for s in sent if "projection_state SET" in s], sent
        assert totals(store) == replayed_totals(store)
    assert _read(store_url) == {name: (1, 5) for name in THREE}


_ROW = st.tuples(
    st.sampled_from([*THREE, "test_gone"]),
    st.sampled_from([THREE["test_other"].version, 9]),
    st.sampled_from([FOLLOWING, 3, 10, 11, 12]),
)
_ROWS = st.lists(_ROW, max_size=5, unique_by=lambda row: row[0])
_STEP = st.one_of(_ROWS, st.integers(0, 2))
"""New rows (the epoch moves), or the log's head moved on by 0-2 (the rows as they were)."""


def _read_at(head: int, epoch: int, rows: list[tuple[Any, ...]]) -> AppendHeads:
    """What an append that does not know `epoch` reads: the heads and epoch in every row."""
    return AppendHeads(head, 1, epoch, [(head, 1, epoch, *row) for row in rows])


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=st.lists(_STEP, min_size=1, max_size=8))
def test_which_projections_follow_depends_on_the_rows_and_head_read_alone(
    sqlite_url: str, steps: list[list[tuple[Any, ...]] | int]
) -> None:
    """`follow` remembers the epoch at which it last decided without changing a row, and
    answers at once, reading no row, while the epoch holds (the log's head moving on or not):
    what it answers is still what it decides from the rows and the head alone. The epoch
    moves whenever the rows change (the database's triggers); each read twice in a row."""
    remembering = ProjectionSet(THREE)
    head, epoch, rows = 10, 0, []
    with open_store(sqlite_url, projections=THREE) as store, store.write_transaction() as conn:
        for step in steps:
            if isinstance(step, int):
                head += step
            else:
                epoch, rows = epoch + 1, step
            for _ in range(2):
                known = remembering.known_epoch == epoch
                found = remembering.follow(conn, _read_at(head, epoch, [] if known else rows))
                decided = ProjectionSet(THREE).follow(conn, _read_at(head, epoch, rows))
                assert set(found) == set(decided)


def test_the_check_constraint_refuses_other_negative_checkpoints(store_url: str) -> None:
    with open_store(store_url, projections=TOTALS) as store:
        store.append("a", [added(1)])
        refused = pytest.raises(StoreError, match=r"ck_projection_state_checkpoint|CHECK")
        with refused, store.write_transaction() as conn:
            conn.execute(update(PROJECTION_STATE).values(checkpoint=-2))
    assert _read(store_url) == {"test_totals": (1, 1)}


def test_the_migration_downgrades_a_following_checkpoint_to_the_head(store_url: str) -> None:
    with open_store(store_url, projections=TOTALS) as store:
        store.append("a", [added(1), added(2)])
        store.append("a", [added(3)])
    assert _stored(store_url) == {"test_totals": (1, FOLLOWING)}
    engine = create_engine(store_url)
    try:
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0004")
        with engine.connect() as conn:
            assert list(conn.execute(text("SELECT name, checkpoint FROM projection_state"))) == [
                ("test_totals", 3)
            ]
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
    finally:
        engine.dispose()
    with open_store(store_url, projections=TOTALS) as store:
        store.append("a", [added(4)])  # at the head again: it follows the log from here
        assert totals(store) == replayed_totals(store) == {"a": (10, 4)}
    assert _stored(store_url) == {"test_totals": (1, FOLLOWING)}
