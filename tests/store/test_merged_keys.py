"""Keys that become the same JSON key are refused, not merged (`trm_store.value_walk`): in an
`Any` field `{1: "a", "1": "b"}` was written as `{"1": "b"}`, a value silently lost, while the
same dict in meta was refused (a hostile review)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import to_jsonable_python

from trm_store import EventValidationError, NewEvent, Store, register_event_type


class _Free(BaseModel):
    x: Any = None


register_event_type("test.free", _Free)


@pytest.mark.parametrize(
    "value",
    [
        {1: "from int", "1": "from str"},
        {"deeper": [{True: 1, "true": 2}]},
        {None: 1, "None": 2},
    ],
    ids=["int-and-str", "bool-nested", "none"],
)
def test_keys_that_merge_in_json_are_refused_and_write_nothing(store: Store, value: Any) -> None:
    with pytest.raises(EventValidationError, match="same JSON key"):
        store.append("s", [NewEvent("test.free", {"x": value})])
    with pytest.raises(EventValidationError, match="same JSON key"):
        store.append("s", [NewEvent("test.free", {"x": value}), NewEvent("test.free", {})])
    assert store.head_position() == 0


_KEYS = st.one_of(st.integers(-3, 3), st.integers(-3, 3).map(str), st.booleans(), st.none())


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(_KEYS, st.integers(), max_size=5))
def test_what_is_written_has_every_value_given_or_is_refused(
    store: Store, value: dict[Any, int]
) -> None:
    merged = len(to_jsonable_python(dict.fromkeys(value))) != len(value)
    try:
        (recorded,) = store.append("s", [NewEvent("test.free", {"x": value})])
    except EventValidationError:
        assert merged
        return
    assert not merged
    assert len(store.read_stream("s", recorded.version)[0].data["x"]) == len(value)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({float("nan"): 1}, "not a finite number"),
        ({float("nan"): 1, None: 2}, "not a finite number"),
        ({float("inf"): 1, float("-inf"): 2}, "not a finite number"),
        ({frozenset({1}): 1}, "cannot be a JSON key"),
        ({(1, frozenset()): 1}, "cannot be a JSON key"),
    ],
    ids=["nan", "nan-and-none", "infinities", "frozenset", "tuple-holding-a-frozenset"],
)
@pytest.mark.parametrize("where", ["data", "meta"])
def test_keys_json_cannot_hold_are_refused_with_a_typed_error(
    store: Store, value: Any, says: str, where: str
) -> None:
    """A third review: NaN keys were all written as "None", one value kept; a frozenset key
    escaped as a bare TypeError (in meta, a regression of the key check above)."""
    event = (
        NewEvent("test.free", {"x": value})
        if where == "data"
        else NewEvent("test.free", {}, meta={"x": value})
    )
    with pytest.raises(EventValidationError, match=says):
        store.append("s", [event])
    assert store.head_position() == 0


class _Base64(BaseModel):
    model_config = ConfigDict(ser_json_bytes="base64")
    x: Any = None


class _SecondsFloat(BaseModel):
    model_config = ConfigDict(ser_json_timedelta="float")
    x: Any = None


register_event_type("test.base64", _Base64)
register_event_type("test.seconds", _SecondsFloat)


@pytest.mark.parametrize(
    ("kind", "value", "refused"),
    [
        ("test.base64", {b"a": 1, "YQ==": 2}, True),
        ("test.seconds", {timedelta(seconds=1): 1, "1": 2}, True),
        ("test.base64", {b"\xff": 1}, False),  # the model writes it, as "_w=="
    ],
    ids=["base64-merge", "seconds-merge", "base64-not-utf8"],
)
def test_keys_are_compared_as_the_models_own_serializer_writes_them(
    store: Store, kind: str, value: Any, refused: bool
) -> None:
    """A fourth review: the check turned keys to text with pydantic's default settings, not the
    model's (`ser_json_bytes`, `ser_json_timedelta`): keys the model writes alike passed and one
    value was lost, and a key the model writes was refused."""
    if refused:
        with pytest.raises(EventValidationError, match="same JSON key"):
            store.append("s", [NewEvent(kind, {"x": value})])
        assert store.head_position() == 0
    else:
        (recorded,) = store.append("s", [NewEvent(kind, {"x": value})])
        assert store.read_stream("s")[0].data == recorded.data == {"x": {"_w==": 1}}


class _InnerDefault(BaseModel):
    m: dict[Any, int]


class _InnerBase64(BaseModel):
    model_config = ConfigDict(ser_json_bytes="base64")
    m: dict[Any, int]


register_event_type("test.base64_any", _Base64)  # x: Any, base64
register_event_type("test.default_any", _Free)  # x: Any, the defaults


@pytest.mark.parametrize(
    ("kind", "inner", "refused"),
    [
        ("test.base64_any", _InnerDefault(m={b"a": 1, "a": 2}), True),
        ("test.default_any", _InnerBase64(m={b"a": 1, "YQ==": 2}), True),
        ("test.default_any", _InnerBase64(m={b"\xff": 1}), False),
    ],
    ids=["default-inside-base64", "base64-inside-default", "base64-inside-default-not-utf8"],
)
def test_a_model_inside_an_any_field_has_its_keys_checked_in_its_own_form(
    store: Store, kind: str, inner: BaseModel, refused: bool
) -> None:
    """A fifth review: a model instance in an `Any` field is written with its own settings,
    not the event model's; the check used the event model's only."""
    if refused:
        with pytest.raises(EventValidationError, match="same JSON key"):
            store.append("s", [NewEvent(kind, {"x": inner})])
        assert store.head_position() == 0
    else:
        (recorded,) = store.append("s", [NewEvent(kind, {"x": inner})])
        assert recorded.data == store.read_stream("s")[0].data == {"x": {"m": {"_w==": 1}}}


@pydantic_dataclass(config=ConfigDict(ser_json_bytes="base64"))
class _DataclassBase64:
    m: dict[Any, int]


def test_a_pydantic_dataclass_in_an_any_field_has_its_keys_checked_in_its_own_form(
    store: Store,
) -> None:
    """A sixth review: a pydantic dataclass in an `Any` field is written with its own
    settings too; only models had their form checked."""
    with pytest.raises(EventValidationError, match="same JSON key"):
        store.append(
            "s", [NewEvent("test.default_any", {"x": _DataclassBase64(m={b"a": 1, "YQ==": 2})})]
        )
    assert store.head_position() == 0
