"""NaN and infinities in event data: refused wherever pydantic would write them as null, on a
SQLite file and on PostgreSQL; and what the walk that refuses them leaves to pydantic."""

from __future__ import annotations

from collections import UserString, deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Json, SerializeAsAny, field_validator

from trm_store import EventValidationError, NewEvent, Store, register_event_type


def test_nan_in_data_is_refused_even_when_the_model_allows_it(store: Store) -> None:
    class Loose(BaseModel):
        value: float

    register_event_type("test.loose", Loose)
    with pytest.raises(EventValidationError, match="finite"):
        store.append("s", [NewEvent("test.loose", {"value": float("inf")})])
    assert store.head_position() == 0


class _NullsNonFinite(BaseModel):
    """A model whose own config has pydantic write NaN as null where it infers the type."""

    model_config = ConfigDict(ser_json_inf_nan="null")
    anything: Any = None


class _Base(BaseModel):
    number: int = 1


class _Sub(_Base):
    anything: Any = None


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


@dataclass
class _Point:
    value: Any


class _NanEnum(Enum):
    NAN = float("nan")


class _Untyped(BaseModel):
    anything: Any = None
    mapping: dict[str, Any] = {}
    inner: _NullsNonFinite | None = None
    duck: SerializeAsAny[_Base] | None = None


@pytest.mark.parametrize(
    "data",
    [
        {"anything": float("nan")},
        {"anything": [1.0, {"deep": (float("-inf"),)}]},
        {"mapping": {"x": float("nan")}},
        {"inner": {"anything": float("nan")}},
        _Untyped(anything=float("inf")),  # a model instance: not validated again
        # A model instance where pydantic serialises it with its own serializer: a config
        # given to the event's serializer would not reach it.
        {"anything": _NullsNonFinite(anything=float("nan"))},
        {"anything": [_Sub(anything=float("inf"))]},
        {"duck": _Sub(anything=float("nan"))},
        # What pydantic writes by inference beyond dicts, lists and models (review, eighteenth
        # session): each was written as null.
        {"anything": _Point(float("nan"))},
        {"anything": [_Point([float("inf")])]},
        {"anything": deque([float("inf")])},
        {"anything": _NanEnum.NAN},
        {"anything": _Open(other=float("nan"))},
    ],
    ids=[
        "any",
        "any-nested",
        "dict-value",
        "inner-config-null",
        "instance",
        "any-holding-a-model",
        "any-holding-models",
        "serialize-as-any",
        "dataclass",
        "dataclass-nested",
        "deque",
        "enum",
        "model-extra",
    ],
)
@pytest.mark.parametrize("events", [1, 2], ids=["alone", "together"])
def test_nan_where_pydantic_infers_the_type_is_refused_not_written_as_null(
    store: Store, data: Any, events: int
) -> None:
    """One event is validated alone, two of one type together (`EventType.validate_all`)."""
    register_event_type("test.untyped", _Untyped)
    with pytest.raises(EventValidationError, match="finite"):
        store.append("s", [NewEvent("test.untyped", data)] * events)
    assert store.head_position() == 0


class _FailingCollection(Collection[float]):
    """A collection whose iteration fails, as a closed cursor's would."""

    def __len__(self) -> int:
        return 1

    def __contains__(self, item: object) -> bool:
        return False

    def __iter__(self) -> Iterator[float]:
        raise RuntimeError("backend connection closed")


@pytest.mark.parametrize(
    "make",
    [
        lambda: UserString("x"),
        lambda: range(10**18),
        _FailingCollection,
        lambda: (x for x in [1.0]),
    ],
    ids=["user-string", "huge-range", "failing-collection", "generator"],
)
def test_what_the_nan_walk_does_not_read_is_left_to_pydantic(
    store: Store, make: Callable[[], Any]
) -> None:
    """The walk reads only what pydantic writes by inference: anything else is pydantic's to
    refuse (a typed error, at once), never iterated by the walk, which could fail, recurse
    forever or not end (review, eighteenth session). A generator is pydantic's to write."""
    register_event_type("test.untyped", _Untyped)
    value = make()
    try:
        store.append("s", [NewEvent("test.untyped", {"anything": value})])
    except EventValidationError as e:
        assert "serialize unknown type" in str(e)
        assert store.head_position() == 0
    else:
        assert isinstance(value, Iterator)  # pydantic writes what a generator yields
        assert [e.data["anything"] for e in store.read_all()] == [[1.0]]


def test_nan_in_an_any_field_is_refused_not_written_as_null(store: Store) -> None:
    class Anything(BaseModel):
        value: object

    register_event_type("test.anything", Anything)
    for bad in [float("nan"), {"x": [1.0, float("-inf")]}]:
        with pytest.raises(EventValidationError, match="finite"):
            store.append("s", [NewEvent("test.anything", {"value": bad})])
    assert store.head_position() == 0


class _Made(BaseModel):
    """Fields whose values validation makes: parsed from JSON text, by a validator of the
    model's own, from a view of a dict (a list to pydantic)."""

    parsed: Json[Any] = None
    converted: Any = None
    listed: list[Any] = []

    @field_validator("converted", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        return float(value) if isinstance(value, str) else value


@pytest.mark.parametrize(
    "data",
    [
        {"parsed": '{"score": NaN}'},
        {"parsed": "[Infinity]"},
        {"converted": "nan"},
        {"listed": {"k": float("nan")}.values()},
    ],
    ids=["json-text", "json-text-list", "validator", "dict-view"],
)
@pytest.mark.parametrize("events", [1, 2], ids=["alone", "together"])
def test_nan_that_validation_makes_is_refused_not_written_as_null(
    store: Store, data: dict[str, Any], events: int
) -> None:
    """The data given holds no NaN: validation makes it (review, nineteenth session: each was
    written as null, the walk looked only at the data given)."""
    register_event_type("test.made", _Made)
    with pytest.raises(EventValidationError, match="finite"):
        store.append("s", [NewEvent("test.made", data)] * events)
    assert store.head_position() == 0
