"""`recorded_event` builds exactly what `RecordedEvent(...)` builds, frozen as it is."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trm_store.events import RecordedEvent, recorded_event

FIELDS = st.tuples(
    st.integers(),
    st.text(),
    st.text(),
    st.integers(),
    st.text(),
    st.integers(),
    st.dictionaries(st.text(), st.integers()),
    st.dictionaries(st.text(), st.text()),
    st.datetimes(timezones=st.just(UTC)),
)


@given(FIELDS)
def test_recorded_event_equals_the_dataclass_built_the_usual_way(values: tuple[Any, ...]) -> None:
    fast, usual = recorded_event(*values), RecordedEvent(*values)
    assert type(fast) is RecordedEvent
    assert fast == usual
    assert repr(fast) == repr(usual)
    assert dataclasses.astuple(fast) == values


def test_it_sets_every_field_and_the_event_stays_frozen() -> None:
    names = [f.name for f in dataclasses.fields(RecordedEvent)]
    assert list(RecordedEvent.__slots__) == names  # the slots it sets are the fields, in order
    event = recorded_event(1, "e", "s", 1, "t", 1, {}, {}, datetime.now(UTC))
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.position = 2  # type: ignore[misc]
