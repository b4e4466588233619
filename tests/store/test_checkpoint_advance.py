"""The checkpoints' advance in every append: only a projection of this code, at its version and
at the log's head, moves on with the append (and an append refused after the heads' read moved
them, on PostgreSQL, moves them back); and on SQLite the statement scans `projection_state`
once rather than searching its primary key once per projection (a MULTI-INDEX OR:
`trm_store.projection_runner.ProjectionSet`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from sqlalchemy import event, select, update

from tests.store.helpers import TOTALS, NamedTotals, added
from trm_store import ConcurrencyError, open_store
from trm_store.schema import PROJECTION_STATE

THREE = {**TOTALS, "test_other": NamedTotals("test_other"), "test_third": NamedTotals("test_third")}


def _checkpoints(url: str) -> Mapping[str, tuple[int, int]]:
    with open_store(url, read_only=True, projections={}) as store, store._reading() as conn:
        return {r.name: (r.version, r.checkpoint) for r in conn.execute(select(PROJECTION_STATE))}


def test_only_projections_at_their_version_and_at_the_head_move_on(store_url: str) -> None:
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
        with pytest.raises(ConcurrencyError):  # after the heads' read: moved back on PostgreSQL
            store.append("c", [added(6)], expected_version=0)
    assert _checkpoints(store_url) == {
        "test_totals": (1, 5),
        "test_other": (9, 1),
        "test_third": (1, 0),
        "test_fourth": (1, 0),
    }


def test_sqlite_scans_projection_state_instead_of_searching_it_per_projection(
    sqlite_url: str,
) -> None:
    sent: list[tuple[str, Any]] = []
    with open_store(sqlite_url, projections=THREE) as store:
        engine = store._backend.engine

        @event.listens_for(engine, "before_cursor_execute")
        def _seen(_conn: Any, _cursor: Any, sql: str, params: Any, *_: Any) -> None:
            if sql.startswith("UPDATE projection_state SET checkpoint"):
                sent.append((sql, params))

        store.append("a", [added(1)])
        [(sql, params)] = sent
        raw = engine.raw_connection()
        try:
            plan = [row[-1] for row in raw.cursor().execute(f"EXPLAIN QUERY PLAN {sql}", params)]
        finally:
            raw.close()
    assert plan[0] == "SCAN projection_state"
    assert "MULTI-INDEX OR" not in plan
