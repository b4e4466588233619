"""Projection recovery: version changes, interrupted rebuilds, lagging checkpoints, read-only."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from sqlalchemy import Column, Connection, Integer, MetaData, Table, select, text, update

from tests.store.helpers import (
    TOTALS,
    NamedTotals,
    Tableless,
    Totals,
    TotalsV2,
    added,
    replayed_totals,
    totals,
)
from trm_store import (
    Projection,
    ReadOnlyStoreError,
    RecordedEvent,
    StaleProjectionError,
    StoreError,
    open_store,
)
from trm_store.schema import PROJECTION_STATE


def _state(url: str) -> dict[str, tuple[int, int, str]]:
    """Each projection's row, its checkpoint as a position (the head for one that follows)."""
    with open_store(url, read_only=True, projections={}) as store:
        return {
            name: (s.version, s.checkpoint, s.status)
            for name, s in store.projection_status().items()
        }


def test_a_store_without_the_projection_leaves_it_behind_and_a_writable_open_catches_up(
    store_url: str,
) -> None:
    with open_store(store_url, projections=TOTALS) as store:
        store.append("a", [added(1)])
    with open_store(store_url, projections={}) as bare:
        bare.append("a", [added(2), added(3)])
    assert _state(store_url)["test_totals"][1] == 1
    with open_store(store_url, projections=TOTALS) as store:
        assert totals(store) == {"a": (6, 3)}
        assert _state(store_url)["test_totals"] == (1, 3, "ready")


def test_a_changed_version_is_rebuilt_on_open(store_url: str) -> None:
    with open_store(store_url, projections=TOTALS) as store:
        store.append("a", [added(1), added(2)])
    with open_store(store_url, projections={"test_totals": TotalsV2()}) as store:
        assert _state(store_url)["test_totals"] == (2, 2, "ready")
        with store.query("test_totals") as (conn, tables):
            assert [tuple(r) for r in conn.execute(select(tables["totals"]))] == [("a", 3, 2, 2, 6)]
        store.append("a", [added(4)])
        assert store.verify_projections() == []


def test_an_interrupted_rebuild_is_redone_on_the_next_writable_open(store_url: str) -> None:
    with open_store(store_url, projections=TOTALS) as store:
        store.append("a", [added(1), added(2)])
        # What a rebuild killed mid-way leaves: the mark and a half-filled scratch table.
        with store.write_transaction() as conn:
            conn.execute(update(PROJECTION_STATE).values(status="rebuilding"))
            scratch = Totals().define(MetaData(), "__rebuild")["totals"]
            scratch.create(conn)
            conn.execute(
                scratch.insert().values(stream_id="a", total=999, count=1, last_position=1)
            )
    with open_store(store_url, projections=TOTALS) as store:
        assert _state(store_url)["test_totals"] == (1, 2, "ready")
        assert totals(store) == {"a": (3, 2)}
        assert store.verify_projections() == []


def test_rebuild_reproduces_the_live_tables_and_verify_finds_tampering(store_url: str) -> None:
    with open_store(store_url, projections=TOTALS) as store:
        for i in range(30):
            store.append(f"s-{i % 4}", [added(i)])
        before = totals(store)
        assert store.rebuild_projections() == {"test_totals": 30}
        assert totals(store) == before == replayed_totals(store)
        with store.write_transaction() as conn:
            conn.execute(text("UPDATE test_totals SET total = total + 1 WHERE stream_id = 's-1'"))
        differences = store.verify_projections()
        assert differences and all("test_totals.totals" in d for d in differences)
        assert store.rebuild_projections(only="test_totals") == {"test_totals": 30}
        assert store.verify_projections() == []


def test_rebuild_of_an_unknown_projection_is_refused(store_url: str) -> None:
    with (
        open_store(store_url, projections=TOTALS) as store,
        pytest.raises(StoreError, match="unknown projection"),
    ):
        store.rebuild_projections(only=["nope"])


def test_read_only_open_never_writes(store_url: str) -> None:
    with open_store(store_url, projections=TOTALS) as store:
        store.append("a", [added(1)])
    with open_store(store_url, read_only=True, projections=TOTALS) as ro:
        assert totals(ro) == {"a": (1, 1)}
        with pytest.raises(ReadOnlyStoreError):
            ro.append("a", [added(2)])
        with pytest.raises(ReadOnlyStoreError):
            ro.rebuild_projections()
        with pytest.raises(ReadOnlyStoreError), ro.write_transaction():
            pass
        # Not even raw SQL on the store's own connections can write.
        with pytest.raises(ReadOnlyStoreError), ro._reading() as conn:
            conn.execute(
                text("INSERT INTO projection_state VALUES ('x', 1, 0, 'ready', '2026-01-01')")
            )
    assert _state(store_url) == {"test_totals": (1, 1, "ready")}


def test_read_only_open_of_a_stale_projection_names_the_replay_command(store_url: str) -> None:
    with open_store(store_url, projections=TOTALS) as store:
        store.append("a", [added(1)])
    with open_store(store_url, projections={}) as bare:
        bare.append("a", [added(2)])
    with open_store(store_url, read_only=True, projections=TOTALS) as ro:
        assert len(ro.read_stream("a")) == 2  # the log itself stays readable
        with pytest.raises(StaleProjectionError, match="trm replay-projections"):
            totals(ro)
    assert _state(store_url)["test_totals"][1] == 1


def test_read_only_query_of_a_projection_never_created_is_stale_not_a_driver_error(
    store_url: str,
) -> None:
    with open_store(store_url, projections={}) as bare:
        bare.append("a", [added(1)])
    with open_store(store_url, read_only=True, projections=TOTALS) as ro:
        with pytest.raises(StaleProjectionError, match="trm replay-projections"):
            totals(ro)
        assert ro.head_position() == 1  # the failed query left the store usable


def test_read_only_open_of_a_missing_sqlite_file_is_a_clear_error(tmp_path: object) -> None:
    with pytest.raises(StoreError, match="no SQLite store"):
        open_store(f"sqlite:///{tmp_path}/missing.db", read_only=True)


class _Exploding(Projection):
    name = "exploding"
    version = 1
    event_types = frozenset({"test.added"})

    def define(self, metadata: MetaData, suffix: str) -> dict[str, Table]:
        return {"t": Table(f"exploding{suffix}", metadata, Column("id", Integer, primary_key=True))}

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        if any(e.data["amount"] < 0 for e in events):
            raise StoreError("negative amounts are refused by this read model")


def test_a_projection_that_refuses_an_event_rolls_the_append_back(store_url: str) -> None:
    with open_store(store_url, projections={**TOTALS, "exploding": _Exploding()}) as store:
        store.append("a", [added(1)])
        with pytest.raises(StoreError, match="negative"):
            store.append("a", [added(5), added(-1)])
        assert store.head_position() == 1
        assert totals(store) == {"a": (1, 1)}


def test_only_current_projections_advance_inline_and_the_lagging_one_catches_up(
    store_url: str,
) -> None:
    both = {**TOTALS, "test_other_totals": NamedTotals("test_other_totals")}
    with open_store(store_url, projections=both) as store:
        store.append("a", [added(1)])
        with open_store(store_url, projections=TOTALS) as older:  # a process without it
            older.append("a", [added(2)])
        store.append("a", [added(3)])
        states = _state(store_url)
        assert states["test_totals"][1] == 3
        assert states["test_other_totals"][1] == 1  # not advanced on top of a stale base
    with open_store(store_url, projections=both) as store:
        assert _state(store_url)["test_other_totals"][1] == 3
        assert store.verify_projections() == []
        with store.query("test_other_totals") as (conn, tables):
            assert conn.execute(select(tables["totals"].c.total)).scalar_one() == 6


class _Nameless(Tableless):
    """A projection whose author forgot its `name`."""

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        pass


@pytest.mark.parametrize(
    ("projections", "problem"),
    [
        ({"alias": Totals()}, "key 'alias' is not the projection's name 'test_totals'"),
        ({"test_totals": "totals"}, "'test_totals' is no Projection"),
        ([Totals()], "a mapping of name -> Projection, not a list"),
        ({"nameless": _Nameless()}, "key 'nameless' is not the projection's name None"),
    ],
    ids=["key-not-its-name", "not-a-projection", "not-a-mapping", "no-name"],
)
def test_projections_not_keyed_by_their_own_name_are_refused_before_any_write(
    store_url: str, projections: object, problem: str
) -> None:
    """A projection under another key would be rebuilt under its name and advanced under the
    key: its checkpoint would never move."""
    with pytest.raises(StoreError, match=problem):
        open_store(store_url, projections=projections)  # type: ignore[arg-type]
    with open_store(store_url, projections=TOTALS) as store:
        store.append("a", [added(1)])
    assert set(_state(store_url)) == {"test_totals"}
    assert _state(store_url)["test_totals"][1] == 1


class _TwoFaced(Mapping[str, Any]):
    """A mapping whose `items()` give `checked`, and whose keys and lookups give `kept`."""

    def __init__(self, checked: dict[str, Any], kept: dict[str, Any]) -> None:
        self._checked, self._kept = checked, kept

    def items(self) -> Any:
        return self._checked.items()

    def __getitem__(self, key: str) -> Any:
        return self._kept[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._checked)

    def __len__(self) -> int:
        return len(self._checked)


def test_the_projections_kept_are_the_ones_checked(store_url: str) -> None:
    """Read once: a mapping that gives one projection when checked and another (or no
    projection at all) when read again keeps the one checked."""
    totals = Totals()
    for kept in ({"test_totals": _Nameless()}, {"test_totals": "totals"}):
        with open_store(store_url, projections=_TwoFaced({"test_totals": totals}, kept)) as store:
            store.append("a", [added(1)])
            assert store._projections.projections == {"test_totals": totals}
