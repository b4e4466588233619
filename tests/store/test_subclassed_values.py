"""What is checked is what is written, whatever object holds it: a str or int subclass (an
`enum.StrEnum` member, or something hostile) given as a stream id, a type name, an event id, an
expected version or a prepared event's text is checked and written as the plain `str` or `int`
of its value (`trm_store.vocabulary.exact_text`).

Found by a hostile review: sqlite3 binds a str subclass through its `__conform__`, so a stream id
checked and returned as "mine" was stored as whatever `__conform__` said; a type name looked up by
its own `__eq__`/`__hash__` could stand for a registered type and be stored as unregistered text;
an expected version's own `__ne__` could pass a moved stream's check.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import event

from tests.store.helpers import TOTALS, added
from trm_store import ConcurrencyError, EventValidationError, NewEvent, Store, open_store


class Sneaky(str):
    """Text that tells sqlite3 to store other text, and calls itself equal to anything."""

    def __conform__(self, _protocol: object) -> str:
        return "someone-else"

    def __eq__(self, _other: object) -> bool:
        return True

    def __ne__(self, _other: object) -> bool:
        return False

    __hash__ = str.__hash__


class CaseBlind(str):
    """A name equal, and hashed alike, to any other spelling of it."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and str.lower(self) == str.lower(other)

    def __hash__(self) -> int:
        return hash(str.lower(self))


class Agreeable(int):
    """An expected version that is never unequal to the stream's."""

    def __ne__(self, _other: object) -> bool:
        return False


class Types(enum.StrEnum):
    ADDED = "test.added"


def _bound(store: Store) -> list[Any]:
    """Every parameter the driver is handed from now on."""
    seen: list[Any] = []

    @event.listens_for(store._backend.engine, "before_cursor_execute")
    def _seen(_conn: Any, _cursor: Any, _sql: str, params: Any, _ctx: Any, many: bool) -> None:
        rows = params if many else [params]
        for row in rows:
            seen.extend(row.values() if isinstance(row, dict) else row)

    return seen


def test_a_stream_id_is_written_and_read_as_its_text(store_url: str) -> None:
    with open_store(store_url, projections=TOTALS) as store:
        bound = _bound(store)
        [one] = store.append(Sneaky("mine"), [added(1)])
        [two] = store.append_batch([(Sneaky("mine"), [added(2), added(3)], None)])[:1]
        assert [(e.stream_id, e.version) for e in store.read_all()] == [
            ("mine", 1),
            ("mine", 2),
            ("mine", 3),
        ]
        assert store.read_stream(Sneaky("mine"))[:2] == [one, two]
        assert store.stream_version(Sneaky("mine")) == 3
        assert type(one.stream_id) is str
        assert not [v for v in bound if isinstance(v, str | int) and type(v) not in (str, int)]


def test_a_type_name_is_looked_up_and_written_as_its_text(store_url: str) -> None:
    with open_store(store_url, projections=TOTALS) as store:
        with pytest.raises(EventValidationError, match="unknown event type"):
            store.append("s", [NewEvent(CaseBlind("TEST.ADDED"), {"amount": 1})])
        with pytest.raises(EventValidationError, match="unknown event type"):
            store.append("s", [NewEvent(CaseBlind("TEST.ADDED"), {"amount": k}) for k in (1, 2)])
        assert store.head_position() == 0
        recorded = store.append("s", [NewEvent(Types.ADDED, {"amount": k}) for k in (1, 2)])
        recorded += store.append("s", [NewEvent(Types.ADDED, {"amount": 3})])
        assert [e.type for e in store.read_all()] == ["test.added"] * 3
        assert {type(e.type) for e in recorded} == {str}


def test_an_expected_version_is_compared_as_its_value(store_url: str) -> None:
    with open_store(store_url, projections=TOTALS) as store:
        store.append("s", [added(1), added(2)])
        with pytest.raises(ConcurrencyError):
            store.append("s", [added(3)], expected_version=Agreeable(0))
        with pytest.raises(ConcurrencyError):
            store.append_batch([("s", [added(3)], Agreeable(1)), ("t", [added(4)], None)])
        assert store.head_position() == 2


def test_an_event_id_is_written_as_its_text(store_url: str) -> None:
    given = str(uuid.uuid4())
    with open_store(store_url, projections=TOTALS) as store:
        [recorded] = store.append("s", [added(1, event_id=Sneaky(given))])
        assert [e.event_id for e in store.read_all()] == [given] == [recorded.event_id]


def test_a_prepared_events_texts_are_the_encoders(store_url: str) -> None:
    """A prepared event's JSON and type, replaced by subclasses that lie to `!=` and to
    sqlite3: what is written is the canonical JSON of its data and meta, and its type's text."""
    with open_store(store_url, projections=TOTALS) as store:
        prepared = store.prepare(added(1))
        lying = replace(
            prepared,
            type=Sneaky(prepared.type),
            data_json=Sneaky(prepared.data_json),
            meta_json=Sneaky(prepared.meta_json),
            schema_version=Agreeable(1),
        )
        [recorded] = store.append_prepared("s", [lying])
        [read] = store.read_all()
        assert read == recorded
        assert (read.type, read.data, read.schema_version) == (
            "test.added",
            {"amount": 1, "note": ""},
            1,
        )
        with pytest.raises(EventValidationError, match="its data changed"):
            store.append_prepared("s", [replace(prepared, data_json=Sneaky('{"amount":2}'))])


class Small(int):
    """An int that says it is in any range (`minimum <= value` asks its `__ge__`)."""

    def __ge__(self, _other: object) -> bool:
        return True

    def __le__(self, _other: object) -> bool:
        return True


def test_a_number_is_range_checked_as_its_value(store_url: str) -> None:
    with open_store(store_url, projections=TOTALS) as store:
        prepared = store.prepare(added(1))
        with pytest.raises(EventValidationError, match="schema version"):
            store.append_prepared("s", [replace(prepared, schema_version=Small(2**40))])
        with pytest.raises(EventValidationError, match="expected_version"):
            store.append("s", [added(1)], expected_version=Small(2**64))
        with pytest.raises(EventValidationError):
            store.read_stream("s", Small(-1))
        assert store.head_position() == 0
