"""An event's data is a JSON object on both backends: a model whose normal form is anything else
is refused before anything is written, and a string value that an older trm wrote reads back as
that string (PostgreSQL's driver has decoded it already; decoding it again read it as another
value, or failed every read of the log)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, RootModel, model_serializer
from sqlalchemy import text

from tests.store.helpers import added
from trm_store import EventValidationError, NewEvent, Store, register_event_type
from trm_store.json_codec import dumps_json


class _Text(RootModel[str]):
    pass


class _Numbers(RootModel[list[int]]):
    pass


class _SaysText(BaseModel):
    x: int

    @model_serializer
    def _as_text(self) -> str:
        return f"x={self.x}"


class _Object(RootModel[dict[str, int]]):
    pass


register_event_type("shape.text", _Text)
register_event_type("shape.numbers", _Numbers)
register_event_type("shape.says_text", _SaysText)
register_event_type("shape.object", _Object)

_NOT_OBJECTS = [
    ("shape.text", _Text("plain")),
    ("shape.text", _Text('{"a": 1}')),
    ("shape.numbers", _Numbers([1, 2])),
    ("shape.says_text", {"x": 1}),
    ("shape.says_text", _SaysText(x=1)),
]


@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize(("kind", "data"), _NOT_OBJECTS, ids=repr)
def test_data_whose_normal_form_is_no_object_is_refused_and_writes_nothing(
    store: Store, kind: str, data: Any, count: int
) -> None:
    events = [NewEvent(kind, data) for _ in range(count)]
    for write in (
        lambda: store.append("s", events),
        lambda: store.append_batch([("s", events, None), ("t", [added(1)], None)]),
        lambda: store.prepare(events[0]),
    ):
        with pytest.raises(EventValidationError, match="JSON object"):
            write()
    assert store.head_position() == 0


def test_a_root_model_of_an_object_is_written(store: Store) -> None:
    store.append("s", [NewEvent("shape.object", {"a": 1}), NewEvent("shape.object", {"b": 2})])
    assert [e.data for e in store.read_stream("s")] == [{"a": 1}, {"b": 2}]


def _insert_as_an_older_trm_did(store: Store, position: int, data_json: str) -> None:
    """A row whose data is `data_json` verbatim (an older trm wrote a RootModel's string)."""
    cast = "CAST(:d AS json)" if store.dialect == "postgresql" else ":d"
    with store.write_transaction() as conn:
        conn.execute(
            text(
                "INSERT INTO events (position, event_id, stream_id, stream_version, type,"
                " schema_version, data, meta, recorded_at) VALUES (:p, :i, :s, :v, 'shape.text',"
                f" 1, {cast}, {cast.replace(':d', ':m')}, CURRENT_TIMESTAMP)"
            ),
            {
                "p": position,
                "i": f"00000000-0000-4000-8000-{position:012d}",
                "s": "old",
                "v": position,
                "d": data_json,
                "m": "{}",
            },
        )


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",))))
def test_a_string_an_older_trm_wrote_reads_back_as_itself(store: Store, value: str) -> None:
    position = store.head_position() + 1
    _insert_as_an_older_trm_did(store, position, dumps_json(value, what="data"))
    (event,) = store.read_stream("old", position, limit=1)
    assert event.data == value
    assert [e.data for e in store.read_all(position - 1)] == [value]
