"""The event log's contract, run on a SQLite file and on PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import create_engine, event, text
from sqlalchemy.exc import DBAPIError

from tests.store.helpers import EVENT_INSERTS, added, replayed_totals, totals
from trm_store import (
    ConcurrencyError,
    EventIdConflictError,
    EventValidationError,
    NewEvent,
    Store,
    StoreError,
    open_store,
    register_event_type,
)


def test_append_assigns_dense_positions_and_one_based_versions(store: Store) -> None:
    first = store.append("s-1", [added(1), added(2)])
    second = store.append("s-2", [added(3)])
    third = store.append("s-1", [added(4)])
    assert [e.position for e in first + second + third] == [1, 2, 3, 4]
    assert [e.version for e in first] == [1, 2]
    assert second[0].version == 1
    assert third[0].version == 3
    assert store.head_position() == 4
    assert first[0].meta["pid"] > 0 and first[0].meta["host"]


@pytest.mark.parametrize(
    ("existing", "expected", "ok"),
    [(0, None, True), (0, 0, True), (2, 2, True), (2, 0, False), (0, 1, False), (2, 1, False)],
)
def test_expected_version(store: Store, existing: int, expected: int | None, ok: bool) -> None:
    for i in range(existing):
        store.append("s", [added(i)])
    if ok:
        assert store.append("s", [added(9)], expected_version=expected)[0].version == existing + 1
    else:
        with pytest.raises(ConcurrencyError) as info:
            store.append("s", [added(9)], expected_version=expected)
        assert (info.value.expected, info.value.actual) == (expected, existing)
        assert store.head_position() == existing
        assert totals(store).get("s", (0, 0))[1] == existing


def test_retried_append_with_the_same_event_ids_is_exactly_once(store: Store) -> None:
    ids = [str(uuid.uuid4()), str(uuid.uuid4())]
    events = [added(1, event_id=ids[0]), added(2, event_id=ids[1])]
    first = store.append("s", events, expected_version=0)
    again = store.append("s", events, expected_version=0)
    assert again == first
    assert store.head_position() == 2
    assert totals(store) == {"s": (3, 2)}


@pytest.mark.parametrize(
    "written",
    [str, lambda u: str(u).upper(), lambda u: "{" + str(u) + "}", lambda u: u.urn, lambda u: u.hex],
    ids=["normal", "upper", "braces", "urn", "hex"],
)
def test_event_ids_are_stored_in_normal_form_whatever_form_they_are_given_in(
    store: Store, written: Callable[[uuid.UUID], str]
) -> None:
    given = uuid.uuid4()
    recorded = store.append("s", [added(1, event_id=written(given))])
    assert recorded[0].event_id == str(given)
    assert store.append("s", [added(1, event_id=str(given))]) == recorded  # the same event


def test_partly_recorded_event_ids_are_refused_and_write_nothing(store: Store) -> None:
    known = str(uuid.uuid4())
    store.append("s", [added(1, event_id=known)])
    with pytest.raises(EventIdConflictError, match=f"event_id {known} names event 1 of stream 's'"):
        store.append("s", [added(1, event_id=known), added(2)])
    assert store.head_position() == 1


def test_append_batch_is_all_or_nothing(store: Store) -> None:
    store.append("b", [added(1)])
    with pytest.raises(ConcurrencyError):
        store.append_batch([("a", [added(1)], 0), ("b", [added(1)], 0)])
    assert store.head_position() == 1
    recorded = store.append_batch(
        [("a", [added(1)], 0), ("b", [added(5)], 1), ("a", [added(2)], None)]
    )
    assert [(e.stream_id, e.version) for e in recorded] == [("a", 1), ("b", 2), ("a", 2)]
    assert totals(store) == {"a": (3, 2), "b": (6, 2)}


def test_read_stream_and_read_all(store: Store) -> None:
    for i in range(5):
        store.append(f"s-{i % 2}", [added(i)])
    assert [e.data["amount"] for e in store.read_stream("s-0")] == [0, 2, 4]
    assert [e.version for e in store.read_stream("s-0", from_version=2)] == [2, 3]
    assert store.read_stream("nope") == []
    assert [e.position for e in store.read_all(after_position=2, batch_size=2)] == [3, 4, 5]


def test_read_all_fetches_lazily_in_batches(store: Store) -> None:
    store.append("s", [added(i) for i in range(4)])
    reader = store.read_all(batch_size=2)
    seen = [next(reader).position, next(reader).position]
    store.append("s", [added(9)])  # appended after the first batch was fetched
    seen += [e.position for e in reader]
    assert seen == [1, 2, 3, 4, 5]


def test_recorded_events_read_back_equal(store: Store) -> None:
    written = store.append(
        "s", [NewEvent("test.added", {"amount": 7, "note": "é\u2603"}, meta={"run": "r"})]
    )
    read = store.read_stream("s")
    assert read == written
    assert read[0].meta["run"] == "r"


BAD_EVENTS = [
    pytest.param(
        [NewEvent("no.such.type", {"amount": 1})], "unknown event type", id="unknown-type"
    ),
    pytest.param([NewEvent("test.added", {"amount": "x"})], "amount", id="wrong-type"),
    pytest.param([NewEvent("test.added", {"amount": 1, "extra": 2})], "extra", id="extra-field"),
    pytest.param(
        [NewEvent("test.added", {"amount": 1}, meta={"x": float("nan")})], "not JSON", id="nan-meta"
    ),
    pytest.param(
        [NewEvent("test.added", {"amount": 1}, meta={"x": object()})], "not JSON", id="object-meta"
    ),
    pytest.param(
        [NewEvent("test.added", {"amount": 1}, event_id="nope")], "not a UUID", id="bad-id"
    ),
    pytest.param([NewEvent("test.added", [1, 2])], "mapping", id="data-not-mapping"),  # type: ignore[arg-type]
    pytest.param([], "non-empty", id="no-events"),
    pytest.param([{"type": "test.added"}], "NewEvent", id="not-a-new-event"),
]


@pytest.mark.parametrize(("events", "message"), BAD_EVENTS)
def test_bad_events_raise_and_write_nothing(
    store: Store, events: list[NewEvent], message: str
) -> None:
    store.append("s", [added(1)])
    with pytest.raises(EventValidationError, match=message):
        store.append("s", events)
    assert store.head_position() == 1


@pytest.mark.parametrize(
    ("stream_id", "expected_version"),
    [("", None), ("   ", None), ("x" * 256, None), (42, None), ("s", -1), ("s", True), ("s", "1")],
)
def test_bad_stream_arguments_raise_and_write_nothing(
    store: Store, stream_id: object, expected_version: object
) -> None:
    with pytest.raises(EventValidationError):
        store.append(stream_id, [added(1)], expected_version=expected_version)  # type: ignore[arg-type]
    assert store.head_position() == 0


@pytest.mark.parametrize("items", [[], "abc", [("s", [])], [("s",)], [["s", [], None]]])
def test_bad_batches_raise_and_write_nothing(store: Store, items: object) -> None:
    with pytest.raises(EventValidationError):
        store.append_batch(items)  # type: ignore[arg-type]
    assert store.head_position() == 0


@pytest.mark.parametrize(
    ("call", "args"),
    [("read_stream", ("",)), ("read_stream", ("s", 0)), ("read_all", (-1,)), ("read_all", (0, 0))],
)
def test_bad_read_arguments_raise(store: Store, call: str, args: tuple[object, ...]) -> None:
    with pytest.raises(EventValidationError):
        result = getattr(store, call)(*args)
        list(result)


@pytest.mark.parametrize("events", [1, 2], ids=["alone", "together"])
def test_each_recorded_event_has_its_own_meta(store: Store, events: int) -> None:
    """A caller that changes a recorded event's meta changes that event only: not the other
    events of the append, nor those of later appends (they shared the store's origin dict)."""
    recorded = store.append("s", [added(k) for k in range(events)])
    recorded[0].meta["changed"] = True
    [later] = store.append("s", [added(9)])
    assert [e.meta for e in recorded[1:]] + [later.meta] == [
        {"host": later.meta["host"], "pid": later.meta["pid"]}
    ] * events
    assert store.read_stream("s")[0].meta == later.meta


@pytest.mark.parametrize("statement", ["UPDATE events SET type = 'x'", "DELETE FROM events"])
def test_the_database_refuses_update_and_delete_on_events(
    store: Store, store_url: str, statement: str
) -> None:
    store.append("s", [added(1)])
    engine = create_engine(store_url)
    try:
        with pytest.raises(DBAPIError, match="append-only"), engine.begin() as conn:
            conn.execute(text(statement))
    finally:
        engine.dispose()
    assert [e.type for e in store.read_all()] == ["test.added"]


def test_upcaster_brings_old_schema_versions_to_the_current_one(store: Store) -> None:
    class V1(BaseModel):
        name: str

    class V2(BaseModel):
        first: str
        last: str

    register_event_type("test.person", V1)
    store.append("p", [NewEvent("test.person", {"name": "Ada Lovelace"})])

    def upcast(version: int, data: dict[str, object]) -> dict[str, object]:
        assert version == 1
        first, last = str(data["name"]).split(" ", 1)
        return {"first": first, "last": last}

    register_event_type("test.person", V2, schema_version=2, upcast=upcast)
    try:
        store.append("p", [NewEvent("test.person", {"first": "Alan", "last": "Turing"})])
        events = store.read_stream("p")
        assert [e.schema_version for e in events] == [2, 2]
        assert events[0].data == {"first": "Ada", "last": "Lovelace"}
        assert events[1].data == {"first": "Alan", "last": "Turing"}
    finally:
        register_event_type("test.person", V1)


def test_inline_projection_matches_a_replay(store: Store) -> None:
    for i in range(10):
        store.append(f"s-{i % 3}", [added(i), added(1)])
    assert totals(store) == replayed_totals(store)
    assert store.verify_projections() == []


class _Model(BaseModel):
    x: int


@pytest.mark.parametrize(
    ("name", "model", "kwargs"),
    [
        ("", _Model, {}),
        ("x" * 129, _Model, {}),
        ("t", dict, {}),
        ("t", _Model, {"schema_version": 0}),
        ("t", _Model, {"schema_version": True}),
        ("t", _Model, {"schema_version": 2}),  # a new schema version needs an upcaster
        # Past the column both backends store it in (PostgreSQL's integer, as prepared events):
        ("t", _Model, {"schema_version": 2**31, "upcast": lambda _version, data: data}),
    ],
)
def test_bad_event_type_registrations_are_refused(
    name: str, model: type, kwargs: dict[str, object]
) -> None:
    with pytest.raises(EventValidationError):
        register_event_type(name, model, **kwargs)  # type: ignore[arg-type]


def test_bad_durability_is_refused(sqlite_url: str) -> None:
    with pytest.raises(StoreError, match="durability"):
        open_store(sqlite_url, durability="sometimes")  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["data", "meta"])
def test_nul_characters_are_refused_on_every_backend(store: Store, where: str) -> None:
    event = (
        NewEvent("test.added", {"amount": 1, "note": "a\x00b"})
        if where == "data"
        else NewEvent("test.added", {"amount": 1}, meta={"who": "\x00"})
    )
    with pytest.raises(EventValidationError, match="NUL"):
        store.append("s", [event])
    store.append("s", [NewEvent("test.added", {"amount": 1, "note": "a\\u0000b"})])
    assert store.read_stream("s")[0].data["note"] == "a\\u0000b"


def test_write_transaction_translates_driver_errors(store: Store) -> None:
    store.append("s", [added(1)])
    with pytest.raises(StoreError, match="append-only"), store.write_transaction() as conn:
        conn.exec_driver_sql("DELETE FROM events")


def test_cursor_listeners_on_the_store_engine_see_every_statement_of_an_append(
    store: Store,
) -> None:
    """The append's statements skip SQLAlchemy's execution path, not its cursor events."""
    seen: list[tuple[str, str]] = []

    def before(_conn: Any, _cursor: Any, sql: str, *_rest: Any) -> None:
        seen.append(("before", sql))

    def after(_conn: Any, _cursor: Any, sql: str, *_rest: Any) -> None:
        seen.append(("after", sql))

    engine = store._backend.engine
    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "after_cursor_execute", after)
    try:
        store.append("s", [added(1)])
    finally:
        event.remove(engine, "before_cursor_execute", before)
        event.remove(engine, "after_cursor_execute", after)
    inserts = [w for w, sql in seen if sql.startswith(EVENT_INSERTS)]
    assert inserts == ["before", "after"]
    assert [w for w, _ in seen] == ["before", "after"] * (len(seen) // 2)


def test_a_read_transaction_keeps_its_snapshot_while_others_append(store: Store) -> None:
    """Every SQLAlchemy transaction of the store is a real database one from its first read
    (on SQLite the dialect sends BEGIN: sqlite3 alone would not, before a SELECT)."""
    store.append("s", [added(1)])
    count = text("SELECT count(*) FROM events")
    with store._backend.read_transaction() as conn:
        assert conn.execute(count).scalar_one() == 1
        store.append("s", [added(2)])
        assert conn.execute(count).scalar_one() == 1
    assert store.head_position() == 2


@pytest.mark.parametrize("meta", [None, {"tags": ["a"], "origin": {"job": 7}}])
def test_events_read_back_each_have_their_own_meta(
    store: Store, meta: dict[str, Any] | None
) -> None:
    """Events sharing their meta are decoded once per batch, never handed the same objects."""
    store.append("s", [NewEvent("test.added", {"amount": n}, meta=meta) for n in range(3)])
    for read in (store.read_stream("s"), list(store.read_all())):
        first, second, _ = read
        assert first.meta == second.meta
        first.meta["changed"] = True
        for value in first.meta.values():
            if isinstance(value, list):
                value.append("b")
            elif isinstance(value, dict):
                value["changed"] = True
        assert "changed" not in second.meta
        assert second.meta.get("tags", ["a"]) == ["a"]
        assert second.meta.get("origin", {"job": 7}) == {"job": 7}
