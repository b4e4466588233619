"""`Store.prepare` validates now; `Store.append_prepared` writes later, exactly once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

import pytest

from tests.changing import ChangingSequence
from tests.store.helpers import TOTALS, added, totals
from trm_store import (
    ConcurrencyError,
    EventValidationError,
    NewEvent,
    PreparedEvent,
    ReadOnlyStoreError,
    Store,
    open_store,
)
from trm_store.json_codec import dumps_json
from trm_store.prepared import PreparedAppend


def test_prepared_events_are_written_as_append_writes_them(store: Store) -> None:
    prepared = [
        store.prepare(added(1)),
        store.prepare(NewEvent("test.added", {"amount": 2, "note": "b"})),
    ]
    recorded = store.append_prepared("s-1", prepared)
    assert [(e.version, e.data) for e in recorded] == [
        (1, {"amount": 1, "note": ""}),
        (2, {"amount": 2, "note": "b"}),
    ]
    assert [e.event_id for e in recorded] == [p.event_id for p in prepared]
    assert store.read_stream("s-1") == recorded
    assert totals(store) == {"s-1": (3, 2)}


def test_a_retried_append_of_the_same_prepared_events_is_exactly_once(store: Store) -> None:
    prepared = [store.prepare(added(5)) for _ in range(3)]
    first = store.append_prepared("s-1", prepared)
    again = store.append_prepared("s-1", prepared)
    assert again == first
    assert store.head_position() == 3
    assert totals(store) == {"s-1": (15, 3)}


def test_expected_version_is_checked_and_a_conflict_writes_nothing(store: Store) -> None:
    store.append("s-1", [added(1)])
    with pytest.raises(ConcurrencyError):
        store.append_prepared("s-1", [store.prepare(added(2))], expected_version=0)
    assert store.head_position() == 1
    store.append_prepared("s-1", [store.prepare(added(2))], expected_version=1)
    assert store.head_position() == 2


@pytest.mark.parametrize(
    "event",
    [
        NewEvent("test.added", {"amount": "many"}),
        NewEvent("test.added", {"amount": 1, "extra": True}),
        NewEvent("test.nope", {}),
        NewEvent("test.added", {"amount": 1}, meta={"x": float("nan")}),
        NewEvent("test.added", {"amount": 1}, event_id="not-a-uuid"),
        {"type": "test.added", "data": {"amount": 1}},
    ],
    ids=["wrong-type", "extra-field", "unknown-type", "nan-meta", "bad-id", "not-a-new-event"],
)
def test_prepare_refuses_bad_events_at_once(store: Store, event: Any) -> None:
    with pytest.raises(EventValidationError):
        store.prepare(event)
    assert store.head_position() == 0


@pytest.mark.parametrize(
    ("stream_id", "shape"),
    [
        ("", "one"),
        ("s\x00", "one"),
        ("s-1", "none"),
        ("s-1", "not-prepared"),
        ("s-1", "twice"),
    ],
    ids=["blank-stream", "nul-stream", "no-events", "new-event-not-prepared", "duplicate-id"],
)
def test_append_prepared_refuses_bad_input_and_writes_nothing(
    store: Store, stream_id: str, shape: str
) -> None:
    one = store.prepare(added(1))
    events: dict[str, list[Any]] = {
        "one": [one],
        "none": [],
        "not-prepared": [added(1)],
        "twice": [one, one],
    }
    with pytest.raises(EventValidationError):
        store.append_prepared(stream_id, events[shape])
    assert store.head_position() == 0


def test_a_read_only_store_prepares_but_refuses_to_append(store_url: str) -> None:
    url = store_url
    open_store(url, projections=TOTALS).close()
    with open_store(url, read_only=True, projections=TOTALS) as reader:
        prepared = reader.prepare(added(1))
        assert isinstance(prepared, PreparedEvent)
        with pytest.raises(ReadOnlyStoreError):
            reader.append_prepared("s-1", [prepared])
        assert reader.head_position() == 0


@pytest.mark.parametrize("count", [1, 3])
def test_an_append_holds_each_events_fields_in_the_column_of_that_name(
    store: Store, count: int
) -> None:
    """`PreparedAppend.of` transposes events into columns by position: each column must hold the
    field it is named after, and `events()` gives back the events themselves."""
    events = [
        store.prepare(NewEvent("test.added" if k % 2 else "test.noted", {"amount": k}, {"k": k}))
        for k in range(count)
    ]
    append = PreparedAppend.of("s", None, events, ids_given=True)
    for column, field in [
        ("event_ids", "event_id"),
        ("types", "type"),
        ("schema_versions", "schema_version"),
        ("datas", "data"),
        ("data_jsons", "data_json"),
        ("metas", "meta"),
        ("meta_jsons", "meta_json"),
    ]:
        assert getattr(append, column) == [getattr(e, field) for e in events], column
    assert append.events() == events


def test_append_prepared_writes_the_events_it_checked(store: Store) -> None:
    """A sequence that changes between the check and the write: what was checked is written.
    The later event's data no longer matches its JSON, so the caller would be returned events
    whose data is not what the log holds."""
    checked = store.prepare(added(1))
    changed = replace(checked, data={"amount": 99, "note": "not what the JSON says"})
    recorded = store.append_prepared("s-1", ChangingSequence([checked], [changed]))
    assert [e.data for e in recorded] == [e.data for e in store.read_stream("s-1")]
    assert recorded[0].data == {"amount": 1, "note": ""}


@pytest.mark.parametrize("count", [1, 2])
def test_append_writes_the_events_it_validated(store: Store, count: int) -> None:
    """The same for `append`: a later pass over the sequence must not bring in events of a type
    never validated (here one that is not registered at all)."""
    validated = [added(k) for k in range(count)]
    later = [NewEvent("test.never_registered", {"anything": k}) for k in range(count)]
    recorded = store.append("s-1", ChangingSequence(validated, later))
    assert [e.type for e in recorded] == ["test.added"] * count
    assert [e.type for e in store.read_stream("s-1")] == ["test.added"] * count


def test_append_batch_prepares_the_items_it_checked(store: Store) -> None:
    """And for `append_batch`'s items: a later pass must not bring in an item never checked."""
    checked = [("s-1", [added(1)], None), ("s-2", [added(2)], None)]
    recorded = store.append_batch(ChangingSequence(checked, ["not an item", None]))
    assert [(e.stream_id, e.data["amount"]) for e in recorded] == [("s-1", 1), ("s-2", 2)]


class _Shifty(NewEvent):
    """A NewEvent whose type reads as a registered one the first time only."""

    __slots__ = ()
    reads: ClassVar[dict[int, int]] = {}

    @property  # type: ignore[override]
    def type(self) -> str:
        count = _Shifty.reads[id(self)] = _Shifty.reads.get(id(self), 0) + 1
        return "test.added" if count == 1 else "test.never_registered"


def test_an_event_is_written_with_the_type_it_was_validated_as(store: Store) -> None:
    _Shifty.reads.clear()  # by id: an object of another run may have had the same
    appended, prepared = _Shifty("test.added", {"amount": 1}), _Shifty("test.added", {"amount": 2})
    recorded = store.append("s-1", [appended])
    assert [e.type for e in recorded] == ["test.added"]
    assert [e.type for e in store.read_stream("s-1")] == ["test.added"]
    assert store.prepare(prepared).type == "test.added"


class _Hollow(Sequence[Any]):
    """A sequence that says it has one item and gives none."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: Any) -> Any:
        raise IndexError(index)


def test_a_sequence_that_gives_nothing_is_refused_as_empty(store: Store) -> None:
    with pytest.raises(EventValidationError, match="non-empty list of NewEvent"):
        store.append("s-1", _Hollow())
    with pytest.raises(EventValidationError, match="non-empty list of PreparedEvent"):
        store.append_prepared("s-1", _Hollow())
    with pytest.raises(EventValidationError, match="non-empty list"):
        store.append_batch(_Hollow())
    assert store.head_position() == 0


class _Hook(dict[str, Any]):
    """A dict nested in a prepared event's meta that, when the check encodes it, breaks the
    event's data: its text no JSON, its dict another."""

    target: ClassVar[PreparedEvent | None] = None

    def items(self) -> Any:
        if _Hook.target is not None:
            _Hook.target.data_json = '{"amount": 1, broken'
            _Hook.target.data = {"amount": 999}
        return super().items()


def test_a_field_changed_while_it_is_checked_is_not_written(store: Store) -> None:
    """The check encodes the meta after the data: what the encoding runs cannot change the
    data it has checked. The log stays readable and holds what was checked."""
    prepared = store.prepare(added(1))
    prepared.meta = {**prepared.meta, "hook": _Hook(k=1)}
    prepared.meta_json = dumps_json(prepared.meta, what="meta")
    _Hook.target = prepared
    try:
        recorded = store.append_prepared("s-1", [prepared])
    finally:
        _Hook.target = None
    assert recorded[0].data == {"amount": 1, "note": ""}
    assert [e.data for e in store.read_stream("s-1")] == [{"amount": 1, "note": ""}]
