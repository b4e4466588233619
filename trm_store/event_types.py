"""The registry of event types: each type's pydantic model, schema version and upcaster.

Bad data is refused before it reaches the log (`EventType.validate`), and data stored at an older
schema version is upcast when read (`EventType.read`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import chain
from operator import attrgetter
from typing import Any, NamedTuple

from pydantic import BaseModel, TypeAdapter, ValidationError

from trm_store.errors import EventValidationError
from trm_store.plain_models import SchemaCache, plain_model, refuse_non_finite_fields
from trm_store.value_walk import key_modes, refuse_non_finite, refuse_non_finite_in
from trm_store.vocabulary import INT32_MAX, count_problem, exact_int, exact_text, text_problem

__all__ = [
    "EventType",
    "Together",
    "Upcaster",
    "event_type",
    "register_event_type",
    "registered_event_types",
    "type_name_problem",
    "validation_problem",
]

Upcaster = Callable[[int, dict[str, Any]], dict[str, Any]]
"""Turns the data of an older schema version (given) into the data of the current one."""

_TYPE_NAME_MAX = 128


class Together(NamedTuple):
    """The normal forms of data validated together (`EventType.validate_together`)."""

    normals: list[dict[str, Any]]
    keys_sorted: bool
    """Every dict's keys in sorted order already: `dumps_json_all(..., keys_sorted=True)`."""


@dataclass(frozen=True, slots=True)
class EventType:
    """A registered event type: its model, current schema version and upcaster."""

    name: str
    model: type[BaseModel]
    schema_version: int = 1
    upcast: Upcaster | None = field(default=None)

    def validate(self, data: Mapping[str, Any] | BaseModel) -> dict[str, Any]:
        """Validate `data` against the model; return its normal form (dumps_json checks it).

        NaN and infinities are refused even where the model would take them: pydantic's JSON
        mode would silently write them as null. They are looked for in what validation made
        (the model instance that is serialised), so also where validation makes them: a `Json`
        field's parsed text, a validator's output. An instance of the model given as `data` is
        taken as validated (a value set in it since, or by `model_construct`, is written as
        pydantic serialises it; refusing what its serializer warns of would also refuse valid
        instances, e.g. a default of another type, which pydantic does not validate).
        The model's validator and serializer are called directly: `model_validate` and
        `model_dump` only wrap them, at twice their cost; a plain model's data is validated
        into its normal form directly (`trm_store.plain_models`), no instance made.
        """
        model = self.model
        if type(data) is not dict and not isinstance(data, (model, Mapping)):
            raise EventValidationError(
                f"event {self.name!r}: data must be a mapping, got {type(data).__name__}"
            )
        try:
            plain = plain_model(model) if type(data) is dict else None
            if plain is not None:
                try:
                    normal: dict[str, Any] = plain.one.validate_python(data)
                except ValidationError:
                    pass  # refused: the model's own validation says why, below
                else:
                    refuse_non_finite_fields([normal], plain.floats)
                    return normal
            instance = (
                data
                if isinstance(data, model)
                else model.__pydantic_validator__.validate_python(data)
            )
            refuse_non_finite(instance, keys=(key_modes(model),))
            normal = model.__pydantic_serializer__.to_python(instance, mode="json")
        except ValidationError as e:
            raise EventValidationError(f"event {self.name!r}: {validation_problem(e)}") from e
        except (ValueError, RecursionError) as e:
            # ValueError: a non-finite float, bytes that are not UTF-8, nesting past pydantic's
            # serialisation depth.
            raise EventValidationError(f"event {self.name!r}: {e}") from e
        if not isinstance(normal, dict):  # a RootModel of a list, or a serializer's own value
            raise EventValidationError(
                f"event {self.name!r}: data must serialise to a JSON object, got "
                f"{type(normal).__name__}"
            )
        return normal

    def validate_all(self, datas: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """`validate` of each of `datas` (plain dicts), in one call into pydantic for the lot:
        a list of the model, each item validated and serialised by the model's own schema (a
        plain model's data validated straight into normal forms), so each normal form is the
        one `validate` gives. None when any of them is refused (or pydantic cannot make a list
        of the model): the caller then validates each alone, so the error, and which data it
        names, are `validate`'s.

        Why: an append of 50 events spent ~2.1 us an event in `validate`, ~1 us of it the calls
        themselves (measured with timeit: 5.6 -> 4.3 us an event for `AppendPreparer`).
        """
        together = self.validate_together(datas)
        return None if together is None else together.normals

    def validate_together(self, datas: list[dict[str, Any]]) -> Together | None:
        """`validate_all`, and whether the normal forms' keys are in sorted order (a plain
        model's are: `trm_store.plain_models`), so that their JSON needs no sort."""
        plain = plain_model(self.model)
        try:
            if plain is not None:
                normals: list[dict[str, Any]] = plain.many.validate_python(datas)
                refuse_non_finite_fields(normals, plain.floats)
                return Together(normals, keys_sorted=True)
            adapter = _list_of(self.model)
            if adapter is None:
                return None
            instances = adapter.validator.validate_python(datas)
            # What `validate` walks, every instance's fields in one loop: a walk an instance
            # cost a Python call an event (~0.5 us more, timeit, 100 prediction-shaped data).
            fields: Iterable[Any] = chain.from_iterable(
                map(dict.values, map(_FIELD_VALUES, instances))
            )
            if self.model.model_config.get("extra") == "allow":
                extras = (instance.__pydantic_extra__ or {} for instance in instances)
                fields = chain(fields, chain.from_iterable(map(dict.values, extras)))
            refuse_non_finite_in(fields, 0, (key_modes(self.model),))
            normals = adapter.serializer.to_python(instances, mode="json")
            if not all(isinstance(normal, dict) for normal in normals):
                return None  # `validate` refuses the first that is not, and says why
        except Exception:  # refused, or anything else: `validate` alone says what, as before
            return None
        return Together(normals, keys_sorted=False)

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


_FIELD_VALUES = attrgetter("__dict__")
"""A model instance's fields (its extras are apart, in `__pydantic_extra__`)."""


def _adapter_of(model: type[BaseModel], schema: object) -> TypeAdapter[list[Any]] | None:
    """A list of `model` (None if pydantic cannot build it)."""
    try:
        return TypeAdapter(list[model])  # type: ignore[valid-type]
    except Exception:
        return None


_list_of = SchemaCache(_adapter_of)
"""A list of each model, built once per model and core schema (`SchemaCache`)."""


_REGISTRY: dict[str, EventType] = {}


def register_event_type(
    name: str,
    model: type[BaseModel],
    *,
    schema_version: int = 1,
    upcast: Upcaster | None = None,
) -> EventType:
    """Register (or re-register, idempotently) the model for event type `name`."""
    name, schema_version = exact_text(name), exact_int(schema_version)
    problem = type_name_problem(name)
    if problem is not None:
        raise EventValidationError(f"event type name {problem}")
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise EventValidationError(f"event type {name!r}: model must be a pydantic BaseModel")
    if (problem := count_problem(schema_version, 1, INT32_MAX)) is not None:  # as prepared
        raise EventValidationError(f"event type {name!r}: schema_version {problem}")
    if schema_version > 1 and upcast is None:
        raise EventValidationError(
            f"event type {name!r}: schema_version {schema_version} needs an upcaster"
        )
    registered = EventType(name, model, schema_version, upcast)
    _REGISTRY[name] = registered
    return registered


def type_name_problem(name: object) -> str | None:
    """Why `name` is no event type name (1..128 characters of text both backends store), or
    None when it is one."""
    if not isinstance(name, str) or not name or len(name) > _TYPE_NAME_MAX:
        return f"must be 1..{_TYPE_NAME_MAX} characters"
    return text_problem(name)


def event_type(name: str) -> EventType:
    """The registered type `name`, or EventValidationError (for a name that is no string too)."""
    try:
        # Looked up by its text, not by a subclass's `__eq__`.
        return _REGISTRY[name if type(name) is str else exact_text(name)]
    except (KeyError, TypeError):  # TypeError: an unhashable name (a list)
        raise EventValidationError(f"unknown event type {name!r}: register it first") from None


def registered_event_type(name: str) -> EventType | None:
    """The registered type `name` (exact text), or None."""
    return _REGISTRY.get(name)


def registered_event_types() -> dict[str, EventType]:
    """A copy of the registry, for introspection."""
    return dict(_REGISTRY)
