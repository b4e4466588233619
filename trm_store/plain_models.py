"""Event models whose validated fields are already their normal form: a fast path, fenced here.

A model of plain fields (each a str, int, float or bool, maybe nullable, with no default or one
of its own type or None; no validator, serializer, alias, exclusion, computed field, extras or
`__init__` of its own) is written in pydantic's JSON mode as exactly the dict that validation
stores as the instance's `__dict__`: pydantic turns each value into its exact builtin type
(a `str` subclass, an `IntEnum`, a float given as an int all come out as str, int, float). For
such a model `EventType` takes that dict as the normal form and skips the serializer and the
walk for NaN, which only its float fields need (`refuse_non_finite_fields`). Why: the two cost
~11,000 of the ~97,000 instructions an appended event of a prediction-shaped model costs
(`bench/writers_instructions.py`), and ~100 dicts an append for the garbage collector to count.

What this relies on, the layout of pydantic's core schema and what its validators store, a
pydantic upgrade could change: pyproject allows only the minor version CI has run, and
`tests/store/test_plain_models.py` compares this path with pydantic's serializer, for generated
models and data, and for each way a model stops being plain. Anything this does not recognise
takes pydantic's own path.
"""

from __future__ import annotations

from functools import cache
from math import isfinite
from operator import itemgetter
from typing import Any

from pydantic import BaseModel

__all__ = ["plain_float_fields", "refuse_non_finite_fields"]

_SCALARS: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}
_FIELD_KEYS = frozenset({"type", "schema", "metadata", "validation_alias", "frozen"})
"""What a plain field's schema may hold: nothing that changes how it is written."""
_NO_DEFAULT = object()


@cache
def plain_float_fields(model: type[BaseModel]) -> tuple[str, ...] | None:
    """The names of `model`'s float fields when it is plain (see the module), else None.

    Asked once a model, after pydantic built it (a model whose build was deferred has no core
    schema before its first validation)."""
    schema = getattr(model, "__pydantic_core_schema__", None)
    if type(schema) is not dict or not _plain_model(schema):
        return None
    floats: list[str] = []
    for name, field in schema["schema"]["fields"].items():
        kind = _plain_field(field)
        if kind is None:
            return None
        if kind is float:
            floats.append(name)
    return tuple(floats)


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
