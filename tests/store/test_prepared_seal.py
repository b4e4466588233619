"""`append_prepared` writes only what a type's model makes (`trm_store.prepared_check`): an event
this process's `prepare` made and nobody changed goes in as it is; any other is validated again.

A hostile review found that changing a prepared event's data together with its JSON, or its
type, passed the check (each field still matched its own JSON): data the model refuses went into
the log, and an event retyped to a domain type failed in its projection with a raw KeyError."""

from __future__ import annotations

import pickle
from dataclasses import replace
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from tests.store.helpers import TOTALS, added, totals
from trm_store import (
    EventValidationError,
    NewEvent,
    PreparedEvent,
    Store,
    open_store,
    register_event_type,
)
from trm_store.json_codec import dumps_json


def _changed(event: PreparedEvent, **fields: Any) -> PreparedEvent:
    """`event` with `fields` changed in place, each dict's JSON changed with it."""
    for name, value in fields.items():
        setattr(event, name, value)
        if name in ("data", "meta"):
            setattr(event, f"{name}_json", dumps_json(value, what=name))
    return event


def test_data_changed_with_its_json_into_what_the_model_refuses_is_not_written(
    store: Store,
) -> None:
    prepared = _changed(store.prepare(added(1)), data={"amount": "many", "note": ""})
    with pytest.raises(EventValidationError, match="amount"):
        store.append_prepared("s", [prepared])
    assert store.head_position() == 0


def test_a_type_changed_is_checked_against_the_new_types_model(store: Store) -> None:
    prepared = _changed(store.prepare(added(1)), type="gate.started", data={})
    with pytest.raises(EventValidationError, match=r"gate\.started"):
        store.append_prepared("gate:g1", [prepared])
    assert store.head_position() == 0


def test_a_type_this_process_never_registered_is_written_as_its_json_says(store: Store) -> None:
    """Documented: another process prepared it, and no projection here takes it."""
    prepared = _changed(store.prepare(added(1)), type="test.nowhere")
    assert store.append_prepared("s", [prepared])[0].type == "test.nowhere"


def test_data_changed_into_what_the_model_makes_is_written(store: Store) -> None:
    prepared = _changed(store.prepare(added(1)), data={"amount": 7, "note": "x"})
    (recorded,) = store.append_prepared("s", [prepared])
    assert recorded.data == {"amount": 7, "note": "x"} == store.read_stream("s")[0].data


def test_data_in_another_form_than_the_models_normal_one_is_refused(store: Store) -> None:
    """`"7"` validates as 7 in lax mode; the JSON to be written says `"7"`: not what the model
    makes of it, so not written (the log would hold text its type's model never wrote)."""
    prepared = _changed(store.prepare(added(1)), data={"amount": "7", "note": ""})
    with pytest.raises(EventValidationError, match="not what the model"):
        store.append_prepared("s", [prepared])
    assert store.head_position() == 0


def test_an_event_built_by_hand_is_validated(store: Store) -> None:
    made = store.prepare(added(1))
    by_hand = PreparedEvent(made.event_id, "test.added", 1, {"amount": 2}, '{"amount":2}', {}, "{}")
    with pytest.raises(EventValidationError):  # the normal form has its "note"
        store.append_prepared("s", [by_hand])
    by_hand = PreparedEvent(
        made.event_id,
        "test.added",
        1,
        {"amount": 2, "note": ""},
        dumps_json({"amount": 2, "note": ""}, what="data"),
        {},
        "{}",
    )
    assert store.append_prepared("s", [by_hand])[0].data == {"amount": 2, "note": ""}


def test_an_event_unpickled_is_validated_again_and_written(store: Store) -> None:
    """As one prepared in another process would be: its seal is not this process's."""
    prepared = pickle.loads(pickle.dumps(store.prepare(added(3))))
    assert store.append_prepared("s", [prepared])[0].data == {"amount": 3, "note": ""}


def test_a_copy_of_a_sealed_event_is_as_prepare_left_it(store: Store) -> None:
    prepared = store.prepare(added(3))
    assert store.append_prepared("s", [replace(prepared)])[0].data == {"amount": 3, "note": ""}


class _Before(BaseModel):
    n: int


class _After(BaseModel):
    n: int
    unit: str


def test_a_sealed_event_is_written_across_an_upgrade_of_its_type(store: Store) -> None:
    """A writer that buffered events, then registered a newer schema version: its sealed events
    are written as prepared, at their schema version (reads upcast them)."""
    register_event_type("seal.upgraded", _Before)
    prepared = store.prepare(NewEvent("seal.upgraded", {"n": 1}))
    register_event_type(
        "seal.upgraded", _After, schema_version=2, upcast=lambda _v, d: {**d, "unit": "s"}
    )
    store.append_prepared("s", [prepared])
    assert store.read_stream("s")[0].data == {"n": 1, "unit": "s"}
    changed = _changed(store.prepare(NewEvent("seal.upgraded", {"n": 2, "unit": "m"})))
    changed.schema_version = 1
    with pytest.raises(EventValidationError, match="schema version 2, not 1"):
        store.append_prepared("s", [changed])


_VALUES = st.one_of(
    st.integers(), st.text(max_size=5), st.floats(allow_nan=False), st.booleans(), st.none()
)


def test_the_log_holds_only_what_the_model_makes(store_url: str) -> None:
    """Whatever data a prepared event is changed to (its JSON with it): either refused, writing
    nothing, or written as the model's own normal form of it. (No projection: the test one sums
    amounts into a column that a huge one overflows, a refusal of its own.)"""
    with open_store(store_url, projections={}) as store:

        @settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(amount=_VALUES, note=_VALUES)
        def check(amount: Any, note: Any) -> None:
            head = store.head_position()
            data = {"amount": amount, "note": note}
            try:
                store.append_prepared("s", [_changed(store.prepare(added(1)), data=data)])
            except EventValidationError:
                assert store.head_position() == head
                return
            written = next(store.read_all(head)).data
            assert written == data
            assert store.prepare(NewEvent("test.added", written)).data == written

        check()


class _Loud(int):
    """An int that encodes as itself and adds as a thousand: a dict holding it has the JSON its
    text says, and is not what the log holds."""

    def __add__(self, other: object) -> int:
        return 1000

    __radd__ = __add__


class _Hook(dict[str, Any]):
    """A dict nested in the meta that, while the check encodes it, changes the data it checked."""

    target: ClassVar[dict[str, Any]] = {}

    def items(self) -> Any:
        _Hook.target["amount"] = 1000
        return super().items()


@pytest.mark.parametrize("how", ["an int subclass", "changed while checked"])
def test_what_is_returned_and_projected_is_what_the_log_holds(store_url: str, how: str) -> None:
    """A sealed event whose data dict says what its JSON says, but is not it (a second review:
    the log held 1, the projection and the returned event 1000)."""
    with open_store(store_url, projections=TOTALS) as store:
        prepared = store.prepare(added(1, meta={"x": {"k": 1}}))
        if how == "an int subclass":
            prepared.data = {"amount": _Loud(1), "note": ""}
        else:
            prepared.meta = {**prepared.meta, "x": _Hook(k=1)}
            _Hook.target = prepared.data
        (recorded,) = store.append_prepared("s", [prepared])
        assert type(recorded.data["amount"]) is int
        assert recorded.data == store.read_stream("s")[0].data == {"amount": 1, "note": ""}
        assert totals(store) == {"s": (1, 1)}
        assert store.verify_projections() == []
