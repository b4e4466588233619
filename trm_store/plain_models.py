"""Event models whose validated fields are already their normal form: a fast path, fenced here.

A model of plain fields (each a str, int, float or bool, maybe nullable, with no default or one
of its own type or None; no validator, serializer, serialization alias, exclusion, computed
field, extras or `__init__` of its own) is written in pydantic's JSON mode as exactly the dict
of its validated fields: pydantic turns each value into its exact builtin type (a `str`
subclass, an `IntEnum`, a float given as an int all come out as str, int, float). For such a
model `EventType` validates the data with the fields' own validators in a typed dict (the
model's config, extra behaviour and validation aliases kept), which makes that dict directly:
no model instance, no call to the serializer, and the walk for NaN only over the float fields
(`refuse_non_finite_fields`). The typed dict lists the fields in sorted order, so the dict's
keys come in the canonical JSON's order and its text is written without a sort. Why: callgrind,
100-event appends of a prediction-shaped model, 97,400 -> 78,800 instructions an event
(`bench/writers_instructions.py`), and 200 objects fewer an append for the garbage collector.

What this relies on, the layout of pydantic's core schema and its validators' output, a pydantic
upgrade could change: pyproject allows only the minor version CI has run, and
`tests/store/test_plain_models.py` compares this path with the model's own validation and
serialisation (what each accepts, and what it makes), for generated models and data, and for
each way a model stops being plain. Anything this does not recognise takes pydantic's own path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import isfinite
from operator import itemgetter
from typing import Any, Generic, TypeVar

from pydantic import BaseModel
from pydantic_core import SchemaValidator, core_schema

__all__ = ["PlainModel", "SchemaCache", "plain_model", "refuse_non_finite_fields"]

T = TypeVar("T")

_SCALARS: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}
_FIELD_KEYS = frozenset({"type", "schema", "metadata", "validation_alias", "frozen"})
"""What a plain field's schema may hold: nothing that changes how it is written."""
_NO_DEFAULT = object()


@dataclass(frozen=True, slots=True)
class PlainModel:
    """How a plain model's data is validated into its normal form, without model instances."""

    floats: tuple[str, ...]
    """The float fields: the only ones that can hold NaN or an infinity."""
    one: SchemaValidator
    """Validates one dict into a dict of the model's fields, as the model validates them."""
    many: SchemaValidator
    """The same for a list of dicts."""


class SchemaCache(Generic[T]):
    """What is built from a model, once per model and core schema: built again when pydantic
    rebuilds the model (`model_rebuild` gives it a new core schema, a deferred build its
    first), so a model changed and rebuilt is never validated by what was built from its old
    schema. The models are held, as the registry of event types holds them."""

    def __init__(self, build: Callable[[type[BaseModel], object], T]) -> None:
        self._build = build
        self._made: dict[type[BaseModel], tuple[object, T]] = {}

    def __call__(self, model: type[BaseModel]) -> T:
        schema = getattr(model, "__pydantic_core_schema__", None)
        made = self._made.get(model)
        if made is not None and made[0] is schema:
            return made[1]
        value = self._build(model, schema)
        self._made[model] = (schema, value)
        return value


def _plain_of(model: type[BaseModel], schema: object) -> PlainModel | None:
    return _plain_validators(schema) if type(schema) is dict else None


plain_model = SchemaCache(_plain_of)
"""The plain-model validators of a model, or None when it is not plain (see the module), or not
built yet (pydantic deferred its build). Their fields' own core schemas, in a typed dict (the
model's config, extra behaviour and aliases kept), validate as the model validates them and
make the normal form directly: no instance is built (280 against 600 ns an event of a list of
100, timeit)."""


def _plain_validators(schema: dict[str, Any]) -> PlainModel | None:
    if not _plain_model(schema):
        return None
    model_fields = schema["schema"]
    floats: list[str] = []
    fields: dict[str, Any] = {}
    # In sorted order: the normal forms' keys are then in the canonical JSON's order, and their
    # encoder need not sort them (`dumps_json_all(..., keys_sorted=True)`).
    for name, field in sorted(model_fields["fields"].items()):
        kind = _plain_field(field)
        if kind is None:
            return None
        if kind is float:
            floats.append(name)
        fields[name] = core_schema.typed_dict_field(
            field["schema"],
            required=field["schema"].get("type") != "default",
            validation_alias=field.get("validation_alias"),
        )
    config = schema.get("config")
    one = core_schema.typed_dict_schema(
        fields,
        strict=model_fields.get("strict"),
        extra_behavior=model_fields.get("extra_behavior"),
        total=True,
        config=config,
    )
    return PlainModel(
        tuple(floats),
        SchemaValidator(one, config),
        SchemaValidator(core_schema.list_schema(one), config),
    )


def _plain_model(schema: dict[str, Any]) -> bool:
    """A model's own schema: no validator around it (it would not be a "model" schema), no
    serializer, `__init__`, `model_post_init`, extras or computed fields."""
    fields = schema.get("schema")
    return (
        schema.get("type") == "model"
        and not schema.get("custom_init")
        and not schema.get("root_model")
        and "post_init" not in schema
        and "serialization" not in schema
        and (schema.get("config") or {}).get("extra_fields_behavior") != "allow"
        and type(fields) is dict
        and fields.get("type") == "model-fields"
        and not fields.get("computed_fields")
        and fields.get("extras_schema") is None
        and fields.get("extras_keys_schema") is None
        and not fields.get("from_attributes")
        and fields.get("extra_behavior") != "allow"
        and "serialization" not in fields
        and type(fields.get("fields")) is dict
    )


def _plain_field(field: Any) -> type | None:
    """The builtin type of a plain field (str, int, float, bool), or None."""
    if type(field) is not dict or field.get("type") != "model-field" or set(field) - _FIELD_KEYS:
        return None
    schema = field["schema"]
    default = _NO_DEFAULT
    if schema.get("type") == "default":
        if set(schema) != {"type", "schema", "default"}:  # a factory, a validated default
            return None
        default, schema = schema["default"], schema["schema"]
    nullable = schema.get("type") == "nullable"
    if nullable:
        if "serialization" in schema:
            return None
        schema = schema["schema"]
    kind = _SCALARS.get(schema.get("type"))
    if kind is None or "serialization" in schema:
        return None
    # A default is stored unvalidated: only one of the field's own type is written as it is
    # (the serializer writes a float field's default 3 as 3.0).
    if (
        default is not _NO_DEFAULT
        and type(default) is not kind
        and not (nullable and default is None)
    ):
        return None
    return kind


def refuse_non_finite_fields(normals: list[dict[str, Any]], names: tuple[str, ...]) -> None:
    """ValueError for a NaN or infinity in any of the fields `names` of `normals`: the float
    fields of a plain model, where pydantic's JSON mode would write one as null."""
    for name in names:
        values = list(map(itemgetter(name), normals))
        if None in values:
            values = [value for value in values if value is not None]
        if not all(map(isfinite, values)):
            bad = next(value for value in values if not isfinite(value))
            raise ValueError(f"{bad} is not a finite number")
