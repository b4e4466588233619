"""The canary of the plain-model fast path (`trm_store.plain_models`): for a model of plain
fields, the normal form `EventType` takes from validation is exactly what pydantic's serializer
writes, for generated models and data; every way a model stops being plain takes pydantic's own
path; and NaN stays refused on the fast path, alone and in a many-event append."""

from __future__ import annotations

import math
from enum import IntEnum, StrEnum
from typing import Annotated, Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    ValidationError,
    computed_field,
    create_model,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)

from trm_store import EventValidationError, NewEvent, Store, register_event_type
from trm_store.event_types import EventType
from trm_store.json_codec import dumps_json_all, same_json
from trm_store.plain_models import plain_model
from trm_store.value_walk import refuse_non_finite


def _serialised(model: type[BaseModel], data: Any) -> dict[str, Any]:
    """What pydantic's own path writes: the instance validation makes, walked for NaN, then
    serialised in JSON mode (the path every model that is not plain takes)."""
    instance = model.__pydantic_validator__.validate_python(data)
    refuse_non_finite(instance)
    normal: dict[str, Any] = model.__pydantic_serializer__.to_python(instance, mode="json")
    return normal


def _same(fast: dict[str, Any], reference: dict[str, Any]) -> None:
    """The same dict, value for value and type for type, and the same canonical text."""
    assert {k: (type(v), v) for k, v in fast.items()} == {
        k: (type(v), v) for k, v in reference.items()
    }
    assert same_json(fast, reference)


class _Colour(StrEnum):
    RED = "red"


class _Level(IntEnum):
    HIGH = 3


class _Text(str):
    pass


class _Real(float):
    pass


_KINDS: dict[type, st.SearchStrategy[Any]] = {
    str: st.text(max_size=5),
    int: st.integers(min_value=-(2**70), max_value=2**70),
    float: st.floats(allow_nan=False, allow_infinity=False),
    bool: st.booleans(),
}
_VALUES = st.one_of(
    *_KINDS.values(),
    st.floats(),  # NaN and infinities too
    st.none(),
    st.sampled_from(
        ["7", "1.5", "true", "no", "", " aB ", "1e400", "nan", _Colour.RED, _Level.HIGH, 10**20]
    ),
    st.text(max_size=3).map(_Text),
    st.floats(allow_nan=False).map(_Real),
    st.lists(st.integers(), max_size=2),
)
"""What a caller may hand a field: its own type, another, a subclass, text pydantic parses."""


_CONSTRAINTS: dict[type, list[dict[str, Any]]] = {
    str: [{}, {"min_length": 1}, {"max_length": 2}, {"pattern": "^[a-c]*$"}, {"strict": True}],
    int: [{}, {"ge": 0}, {"lt": 10}, {"multiple_of": 2}, {"strict": True}],
    float: [{}, {"ge": -1.5}, {"allow_inf_nan": False}, {"strict": True}],
    bool: [{}, {"strict": True}],
}
"""Constraints a plain field may carry: they change what validation takes, not what it makes."""


@st.composite
def _drawn_models(draw: st.DrawFn) -> tuple[type[BaseModel], bool, dict[str, type]]:
    """A model of scalar fields, whether it is plain (it is unless a default is of another type
    than its field's, which pydantic stores unvalidated and its serializer converts), and each
    field's type."""
    fields: dict[str, Any] = {}
    kinds: dict[str, type] = {}
    plain = True
    for i in range(draw(st.integers(min_value=1, max_value=5))):
        kind = draw(st.sampled_from(list(_KINDS)))
        nullable = draw(st.booleans())
        annotation: Any = kind | None if nullable else kind
        constraints = dict(draw(st.sampled_from(_CONSTRAINTS[kind])))
        if draw(st.booleans()):
            constraints["validation_alias"] = f"F{i}"
        default = draw(
            st.sampled_from(["required", "own", "other"] + (["none"] if nullable else []))
        )
        if default == "none":
            constraints["default"] = None
        elif default == "own":
            constraints["default"] = draw(_KINDS[kind])
        elif default == "other":
            other = draw(st.sampled_from([k for k in _KINDS if k is not kind]))
            constraints["default"] = draw(_KINDS[other])
            plain = False
        fields[f"f{i}"] = (annotation, Field(**constraints))
        kinds[f"f{i}"] = kind
    config = ConfigDict(
        strict=draw(st.booleans()),
        extra=draw(st.sampled_from(["ignore", "forbid"])),
        allow_inf_nan=draw(st.booleans()),
        str_strip_whitespace=draw(st.booleans()),
        str_to_lower=draw(st.booleans()),
        str_max_length=draw(st.sampled_from([None, 3])),
        coerce_numbers_to_str=draw(st.booleans()),
        validate_by_name=draw(st.booleans()),
        frozen=draw(st.booleans()),
    )
    model: type[BaseModel] = create_model("Drawn", __config__=config, **fields)
    return model, plain, kinds


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # another type's default
@settings(max_examples=1000, deadline=None)
@given(st.data())
def test_a_plain_models_normal_form_is_what_pydantic_writes(data: st.DataObject) -> None:
    model, plain, kinds = data.draw(_drawn_models())
    assert (plain_model(model) is not None) is plain
    registered = EventType("test.drawn", model)
    given_data = {
        data.draw(st.sampled_from([name, name.upper()])): data.draw(
            st.one_of(_KINDS[kind], _VALUES)  # half of them of the field's own type
        )
        for name, kind in kinds.items()
        if data.draw(st.booleans()) or model.model_fields[name].is_required()
    }
    if data.draw(st.booleans()):
        given_data["unknown"] = 1
    try:
        reference: dict[str, Any] | None = _serialised(model, given_data)
    except (ValidationError, ValueError):
        reference = None
    if reference is None:
        with pytest.raises(EventValidationError):
            registered.validate(given_data)
        assert registered.validate_all([given_data, given_data]) is None
        return
    _same(registered.validate(given_data), reference)
    together = registered.validate_together([given_data, dict(given_data)])
    assert together is not None and len(together.normals) == 2
    for normal in together.normals:
        _same(normal, reference)
    assert together.normals[0] is not together.normals[1]
    # A plain model's keys come in sorted order: its JSON is written without a sort, the same.
    assert together.keys_sorted is plain
    if plain:
        assert all(list(normal) == sorted(normal) for normal in together.normals)
        assert _texts(together.normals, keys_sorted=True) == _texts(together.normals)


def _texts(values: list[Any], keys_sorted: bool = False) -> list[str] | type[Exception]:
    try:
        return dumps_json_all(values, what="data", keys_sorted=keys_sorted)
    except EventValidationError as e:  # NUL, a lone surrogate: refused either way
        return type(e)


def _not_plain_models() -> list[tuple[type[BaseModel], dict[str, Any]]]:
    """A model for each way of not being plain, with data it takes."""

    class Validated(BaseModel):
        x: str

        @field_validator("x")
        @classmethod
        def _upper(cls, value: str) -> str:
            return value.upper()

    class Before(BaseModel):
        x: float

        @model_validator(mode="before")
        @classmethod
        def _double(cls, data: Any) -> Any:
            return {"x": data["x"] * 2}

    class After(BaseModel):
        x: int

        @model_validator(mode="after")
        def _same(self) -> After:
            return self

    class FieldSerialised(BaseModel):
        x: float

        @field_serializer("x")
        def _text(self, value: float) -> str:
            return str(value)

    class ModelSerialised(BaseModel):
        x: int

        @model_serializer
        def _out(self) -> dict[str, Any]:
            return {"y": self.x}

    class Computed(BaseModel):
        x: int

        @computed_field  # type: ignore[prop-decorator]
        @property
        def twice(self) -> int:
            return self.x * 2

    class Aliased(BaseModel):
        model_config = ConfigDict(serialize_by_alias=True)
        x: int = Field(alias="X")

    class SerialisedAlias(BaseModel):
        x: int = Field(serialization_alias="X")

    class Excluded(BaseModel):
        x: int
        secret: str = Field(exclude=True)

    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")
        x: int

    class OtherTypeDefault(BaseModel):
        x: float = 3  # written as 3.0 by the serializer

    class Factory(BaseModel):
        x: str = Field(default_factory=lambda: "made")

    class ValidatedDefault(BaseModel):
        x: float = Field(default=3, validate_default=True)

    class Inner(BaseModel):
        x: int

    class Nested(BaseModel):
        inner: Inner

    class Listed(BaseModel):
        x: list[int]

    class Literally(BaseModel):
        x: Literal["a", "b"]

    class Coloured(BaseModel):
        x: _Colour

    class Real(BaseModel):
        x: Annotated[float, AfterValidator(lambda v: 0.0 if v == 0 else v)]

    class OwnInit(BaseModel):
        x: int

        def __init__(self, **data: Any) -> None:
            super().__init__(**data)

    class PostInit(BaseModel):
        x: int

        def model_post_init(self, context: Any, /) -> None:
            pass

    class Deferred(BaseModel):
        model_config = ConfigDict(defer_build=True)
        x: int

    class Root(RootModel[dict[str, int]]):
        pass

    return [
        (Validated, {"x": "a"}),
        (Before, {"x": 1.5}),
        (After, {"x": 1}),
        (FieldSerialised, {"x": 1.5}),
        (ModelSerialised, {"x": 1}),
        (Computed, {"x": 1}),
        (Aliased, {"X": 1}),
        (SerialisedAlias, {"x": 1}),
        (Excluded, {"x": 1, "secret": "s"}),
        (Open, {"x": 1, "more": [1.5]}),
        (OtherTypeDefault, {}),
        (Factory, {}),
        (ValidatedDefault, {}),
        (Nested, {"inner": {"x": 1}}),
        (Listed, {"x": [1, "2"]}),
        (Literally, {"x": "a"}),
        (Coloured, {"x": "red"}),
        (Real, {"x": -0.0}),
        (OwnInit, {"x": 1}),
        (PostInit, {"x": 1}),
        (Root, {"a": 1}),
        (Deferred, {"x": 1}),
    ]


@pytest.mark.parametrize(
    ("model", "data"), _not_plain_models(), ids=lambda p: getattr(p, "__name__", "")
)
def test_a_model_that_is_not_plain_is_written_as_pydantic_writes_it(
    model: type[BaseModel], data: dict[str, Any]
) -> None:
    registered = EventType("test.not_plain", model)
    normal = registered.validate(data)  # first: a deferred model is built by its validation
    if model.__name__ != "Deferred":
        assert plain_model(model) is None, model.__name__
    _same(normal, _serialised(model, data))
    together = registered.validate_all([data, data])
    assert together is not None
    for each in together:
        _same(each, _serialised(model, data))


class _Reading(BaseModel):
    sensor: str
    value: float
    spare: float | None = None


def test_non_finite_floats_of_a_plain_model_are_refused_and_nothing_is_written(
    store: Store,
) -> None:
    plain = plain_model(_Reading)
    assert plain is not None and plain.floats == ("spare", "value")
    register_event_type("test.reading", _Reading)
    for bad in (math.nan, math.inf, -math.inf):
        for field in ("value", "spare"):
            events = [
                NewEvent("test.reading", {"sensor": "a", "value": 1.0}),
                NewEvent("test.reading", {"sensor": "b", "value": 2.0, field: bad}),
                NewEvent("test.reading", {"sensor": "c", "value": 3.0, "spare": None}),
            ]
            with pytest.raises(EventValidationError, match="finite"):
                store.append("s", events)
            with pytest.raises(EventValidationError, match="finite"):
                store.append("s", events[1:2])
    assert store.head_position() == 0
    recorded = store.append("s", [NewEvent("test.reading", {"sensor": "a", "value": 1})])
    assert recorded[0].data == {"sensor": "a", "value": 1.0, "spare": None}
    assert type(recorded[0].data["value"]) is float
    assert store.read_stream("s")[0].data == recorded[0].data


def _rebuilt_stricter(model: type[BaseModel]) -> None:
    model.model_config["strict"] = True
    model.model_config["str_strip_whitespace"] = True
    model.model_rebuild(force=True)


def test_a_model_changed_and_rebuilt_is_validated_by_its_new_schema() -> None:
    """Found by review: what was built from a model's schema (the plain path's validators, the
    list adapter of the others) was kept after `model_rebuild(force=True)`, so the store took
    data the rebuilt model refuses and wrote what it no longer makes."""

    class Reading(BaseModel):
        name: str
        count: int

    class Checked(BaseModel):  # not plain: validated through the list adapter
        name: str
        count: int

        @field_validator("count")
        @classmethod
        def _positive(cls, value: int) -> int:
            return abs(value)

    for model in (Reading, Checked):
        registered = EventType("test.rebuilt", model)
        assert registered.validate({"name": " a ", "count": "1"})["count"] == 1
        assert registered.validate_all([{"name": " a ", "count": "1"}] * 2) is not None
        _rebuilt_stricter(model)
        with pytest.raises(EventValidationError, match="count"):
            registered.validate({"name": " b ", "count": "2"})
        assert registered.validate_all([{"name": " b ", "count": "2"}] * 2) is None
        assert registered.validate({"name": " c ", "count": 3})["name"] == "c"
        together = registered.validate_all([{"name": " c ", "count": 3}] * 2)
        assert together is not None and [n["name"] for n in together] == ["c", "c"]
