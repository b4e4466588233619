"""The registry of event types: each type's pydantic model, schema version and upcaster.

Bad data is refused before it reaches the log (`EventType.validate`), and data stored at an older
schema version is upcast when read (`EventType.read`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import CoreConfig, SchemaSerializer

from trm_store.errors import EventValidationError

__all__ = [
    "EventType",
    "Upcaster",
    "event_type",
    "register_event_type",
    "registered_event_types",
    "validation_problem",
]

Upcaster = Callable[[int, dict[str, Any]], dict[str, Any]]
"""Turns the data of an older schema version (given) into the data of the current one."""

_TYPE_NAME_MAX = 128
_KEEP_NON_FINITE: CoreConfig = {"ser_json_inf_nan": "constants"}


@dataclass(frozen=True, slots=True)
class EventType:
    """A registered event type: its model, current schema version and upcaster."""

    name: str
    model: type[BaseModel]
    schema_version: int = 1
    upcast: Upcaster | None = field(default=None)
    _serializer: SchemaSerializer | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def validate(self, data: Mapping[str, Any] | BaseModel) -> dict[str, Any]:
        """Validate `data` against the model; return its normal form (dumps_json checks it).

        NaN and infinities are refused even where the model would take them: pydantic's JSON
        mode writes them as null where a value's type is inferred (an `Any` field, a dict's
        values), so they are serialised as floats (`_KEEP_NON_FINITE`) and `dumps_json`, which
        refuses them, sees them. The model's validator and serializer are called directly:
        `model_validate` and `model_dump` only wrap them, at twice their cost.
        """
        model = self.model
        if type(data) is not dict and not isinstance(data, (model, Mapping)):
            raise EventValidationError(
                f"event {self.name!r}: data must be a mapping, got {type(data).__name__}"
            )
        try:
            instance = (
                data
                if isinstance(data, model)
                else model.__pydantic_validator__.validate_python(data)
            )
            serializer = self._serializer or self._keeping_non_finite()
            normal: dict[str, Any] = serializer.to_python(instance, mode="json")
        except ValidationError as e:
            raise EventValidationError(f"event {self.name!r}: {validation_problem(e)}") from e
        except (ValueError, RecursionError) as e:
            # ValueError: bytes that are not UTF-8, nesting past pydantic's serialisation depth.
            raise EventValidationError(f"event {self.name!r}: {e}") from e
        return normal

    def _keeping_non_finite(self) -> SchemaSerializer:
        """The model's serializer with NaN and infinities kept as floats wherever they are (the
        model's own config may say "null"), for `dumps_json` to refuse; built at first use, when
        a model that referred to a later class is complete."""
        serializer = SchemaSerializer(self.model.__pydantic_core_schema__, _KEEP_NON_FINITE)
        object.__setattr__(self, "_serializer", serializer)
        return serializer

    def read(self, schema_version: int, data: dict[str, Any]) -> dict[str, Any]:
        """Bring stored data of `schema_version` up to the current version."""
        if schema_version == self.schema_version or self.upcast is None:
            return data
        return self.upcast(schema_version, data)


def validation_problem(error: ValidationError) -> str:
    """A pydantic error on one line (`field: why; ...`): the `trm` CLI prints a typed error as
    one line, and pydantic's own text spans several, with a link."""
    return "; ".join(
        f"{'.'.join(map(str, item['loc'])) or 'value'}: {item['msg']}" for item in error.errors()
    )


_REGISTRY: dict[str, EventType] = {}


def register_event_type(
    name: str,
    model: type[BaseModel],
    *,
    schema_version: int = 1,
    upcast: Upcaster | None = None,
) -> EventType:
    """Register (or re-register, idempotently) the model for event type `name`."""
    if not isinstance(name, str) or not name or len(name) > _TYPE_NAME_MAX:
        raise EventValidationError(f"event type name must be 1..{_TYPE_NAME_MAX} characters")
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise EventValidationError(f"event type {name!r}: model must be a pydantic BaseModel")
    if (
        isinstance(schema_version, bool)
        or not isinstance(schema_version, int)
        or schema_version < 1
    ):
        raise EventValidationError(f"event type {name!r}: schema_version must be an int >= 1")
    if schema_version > 1 and upcast is None:
        raise EventValidationError(
            f"event type {name!r}: schema_version {schema_version} needs an upcaster"
        )
    registered = EventType(name, model, schema_version, upcast)
    _REGISTRY[name] = registered
    return registered


def event_type(name: str) -> EventType:
    """The registered type `name`, or EventValidationError (for a name that is no string too)."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name (a list)
        raise EventValidationError(f"unknown event type {name!r}: register it first") from None


def registered_event_types() -> dict[str, EventType]:
    """A copy of the registry, for introspection."""
    return dict(_REGISTRY)
