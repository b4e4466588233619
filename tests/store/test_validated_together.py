"""An append's events of one type are validated in one call into pydantic
(`EventType.validate_all`), and an append of one event is built straight into its columns
(`AppendPreparer._one`): what each event becomes, and what is refused with which words, must be
exactly what validating each alone gives (`AppendPreparer.event`).

The property compares the two paths on lists of data of models that exercise pydantic's parts:
coercion, defaults, aliases, validators that rewrite values or raise, nested models, `Any`
fields (where pydantic's JSON mode would write NaN as null), datetimes, and bad values of every
kind the store refuses (NaN, NUL, lone surrogates, wrong types, missing fields).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, field_validator

from trm_store import EventValidationError, NewEvent, register_event_type
from trm_store.event_types import event_type
from trm_store.prepare import AppendPreparer
from trm_store.prepared import PreparedEvent


class Inner(BaseModel):
    score: float
    tags: list[str] = []


class Rich(BaseModel):
    name: str
    count: int = 0
    ratio: float | None = None
    when: datetime | None = None
    anything: Any = None
    inner: Inner | None = None
    alias_field: str = Field("x", alias="aliasField")

    @field_validator("name")
    @classmethod
    def _upper(cls, value: str) -> str:
        if value == "refuse me":
            raise ValueError("this name is refused")
        return value.upper()


RICH = "test.validated_together"
register_event_type(RICH, Rich)

_text = st.one_of(
    st.text(max_size=8), st.sampled_from(["refuse me", "a\x00b", "\ud800", "é✓", "\\", '"'])
)
_float = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e300]),
)
_value = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), _float, _text)
_data = st.fixed_dictionaries(
    {"name": st.one_of(_text, st.integers(0, 3), st.none())},
    optional={
        "count": st.one_of(st.integers(-3, 3), st.sampled_from(["7", "x", 1.5, True])),
        "ratio": st.one_of(_float, st.none(), st.just("0.5")),
        "when": st.sampled_from(
            ["2026-12-04T10:00:00Z", "not a date", datetime(2026, 1, 1, tzinfo=UTC)]
        ),
        "anything": st.one_of(_value, st.lists(_value, max_size=3)),
        "inner": st.one_of(
            st.fixed_dictionaries({"score": _float}, optional={"tags": st.lists(_text)}),
            st.just({"tags": ["no score"]}),
        ),
        "aliasField": _text,
        "extra": _value,
    },
)


def _alone(preparer: AppendPreparer, events: list[NewEvent]) -> list[PreparedEvent]:
    return [preparer.event(new, "s") for new in events]


def _same(a: PreparedEvent, b: PreparedEvent) -> bool:
    """Equal but for the event id (drawn fresh by each path)."""
    return (a.type, a.schema_version, a.data_json, a.meta, a.meta_json) == (
        b.type,
        b.schema_version,
        b.data_json,
        b.meta,
        b.meta_json,
    ) and _json_equal(a.data, b.data)


def _json_equal(a: Any, b: Any) -> bool:
    return bool(a == b) and type(a) is type(b)


@settings(max_examples=300, deadline=None)
@given(datas=st.lists(_data, min_size=1, max_size=6))
def test_validating_together_gives_what_validating_alone_gives(
    datas: list[dict[str, Any]],
) -> None:
    preparer = AppendPreparer({"host": "h", "pid": 1})
    events = [NewEvent(RICH, data) for data in datas]
    try:
        expected = _alone(preparer, events)
    except EventValidationError as e:
        with pytest.raises(EventValidationError) as got:
            preparer(("s", events, None))
        assert str(got.value) == str(e)
        return
    prepared = preparer(("s", events, None)).events()
    assert len(prepared) == len(expected)
    assert all(_same(a, b) for a, b in zip(prepared, expected, strict=True))


def test_the_batch_is_taken_and_its_normal_forms_are_the_models() -> None:
    """The one-call path does run for plain dicts of one type (not only the fallback), and gives
    the model's normal form: coerced, defaulted, aliased, rewritten by its validator."""
    rich = event_type(RICH)
    datas = [{"name": "a", "count": "2", "aliasField": "y"}, {"name": "b"}]
    normal = rich.validate_all(datas)
    assert normal == [rich.validate(data) for data in datas]
    assert normal is not None and normal[0]["name"] == "A" and normal[0]["count"] == 2
    assert rich.validate_all([{"name": "a"}, {"name": "refuse me"}]) is None
    assert rich.validate_all([{"name": "a"}, {"name": "b", "anything": [math.nan]}]) is None


def test_mixed_types_and_model_instances_are_validated_one_by_one() -> None:
    preparer = AppendPreparer({"host": "h", "pid": 1})
    events = [
        NewEvent(RICH, {"name": "a"}),
        NewEvent(RICH, Rich(name="b")),  # an instance: validated already
        NewEvent(RICH, {"name": "c", "inner": {"score": 1}}),
    ]
    prepared = preparer(("s", events, None)).events()
    assert [e.data["name"] for e in prepared] == ["A", "B", "C"]
    assert prepared[2].data["inner"] == {"score": 1.0, "tags": []}
    with pytest.raises(EventValidationError, match="unknown event type"):
        preparer(("s", [NewEvent(RICH, {"name": "a"}), NewEvent("no.such", {})], None))
