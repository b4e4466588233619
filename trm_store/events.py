"""Event values and the registry of event types.

Every event type has a pydantic model registered by name and schema version, so bad data is refused
before it reaches the log, and old schema versions are upcast when read.
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from json.scanner import make_scanner
from typing import Any

from pydantic import BaseModel, ValidationError

from trm_store.errors import EventValidationError

__all__ = [
    "EventType",
    "JsonText",
    "NewEvent",
    "RecordedEvent",
    "Upcaster",
    "dumps_json",
    "event_type",
    "loads_json",
    "recorded_event",
    "register_event_type",
    "registered_event_types",
    "serialize_json",
]

Upcaster = Callable[[int, dict[str, Any]], dict[str, Any]]
"""Turns the data of an older schema version (given) into the data of the current one."""

_TYPE_NAME_MAX = 128
_MAX_DEPTH = 200


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append. `event_id` makes a retried append exactly-once; None draws a UUID.

    `data` is a mapping, or an instance of the type's registered model (validated already).
    """

    type: str
    data: Mapping[str, Any] | BaseModel
    meta: Mapping[str, Any] | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """An event as stored: its global position and its version in its stream."""

    position: int
    event_id: str
    stream_id: str
    version: int
    type: str
    schema_version: int
    data: dict[str, Any]
    meta: dict[str, Any]
    recorded_at: datetime


def _recorded_event_constructor() -> Callable[..., RecordedEvent]:
    """`RecordedEvent(...)`, positional, at half its cost: for every event read or appended.

    A frozen dataclass's `__init__` sets each field with `object.__setattr__`; this sets the
    same slots through their descriptors, which is all that `__init__` does (no defaults, no
    `__post_init__`). A rebuild builds a million of them: ~6% of its instructions.
    """
    new = object.__new__
    setters = [getattr(RecordedEvent, name).__set__ for name in RecordedEvent.__slots__]
    position, event_id, stream_id, version, type_, schema_version, data, meta, at = setters

    def recorded_event(
        p: int,
        e: str,
        s: str,
        v: int,
        t: str,
        sv: int,
        d: dict[str, Any],
        m: dict[str, Any],
        a: datetime,
    ) -> RecordedEvent:
        event: RecordedEvent = new(RecordedEvent)
        position(event, p)
        event_id(event, e)
        stream_id(event, s)
        version(event, v)
        type_(event, t)
        schema_version(event, sv)
        data(event, d)
        meta(event, m)
        at(event, a)
        return event

    return recorded_event


recorded_event = _recorded_event_constructor()


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
        mode would silently write them as null. The model's validator and serializer are called
        directly: `model_validate` and `model_dump` only wrap them, at twice their cost.
        """
        model = self.model
        if type(data) is not dict and not isinstance(data, (model, Mapping)):
            raise EventValidationError(
                f"event {self.name!r}: data must be a mapping, got {type(data).__name__}"
            )
        try:
            _refuse_non_finite(data)
            instance = (
                data
                if isinstance(data, model)
                else model.__pydantic_validator__.validate_python(data)
            )
            normal: dict[str, Any] = model.__pydantic_serializer__.to_python(instance, mode="json")
        except (ValidationError, ValueError, RecursionError) as e:
            # ValueError: a non-finite float, bytes that are not UTF-8, nesting past pydantic's
            # serialisation depth.
            raise EventValidationError(f"event {self.name!r}: {e}") from e
        return normal

    def read(self, schema_version: int, data: dict[str, Any]) -> dict[str, Any]:
        """Bring stored data of `schema_version` up to the current version."""
        if schema_version == self.schema_version or self.upcast is None:
            return data
        return self.upcast(schema_version, data)


def _refuse_non_finite(value: Any, depth: int = 0) -> None:
    """Raise ValueError for a NaN or infinite float anywhere in `value`.

    On every append's path: plain scalars are skipped without a call, and the usual containers
    are recognised by their exact type before the slower isinstance checks.
    """
    kind = type(value)
    if kind is dict:
        items: Iterable[Any] = value.values()
    elif kind is list:
        items = value
    elif kind is float or isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a finite number")
        return
    elif isinstance(value, BaseModel):
        items = value.__dict__.values()
    elif isinstance(value, Mapping):
        items = value.values()
    elif isinstance(value, list | tuple | set | frozenset):
        items = value
    else:
        return
    if depth > _MAX_DEPTH:
        raise ValueError(f"nested deeper than {_MAX_DEPTH} levels")
    for item in items:
        kind = type(item)
        if item is None or kind in _PLAIN:
            continue
        if kind is float:  # checked here: a call per float would double the walk's cost
            if not math.isfinite(item):
                raise ValueError(f"{item} is not a finite number")
            continue
        _refuse_non_finite(item, depth + 1)


_PLAIN = frozenset({str, int, bool})


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
    """The registered type `name`, or EventValidationError."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise EventValidationError(f"unknown event type {name!r}: register it first") from None


def registered_event_types() -> dict[str, EventType]:
    """A copy of the registry, for introspection."""
    return dict(_REGISTRY)


class JsonText(str):
    """JSON already serialised (and checked) by `dumps_json`: written to the database as is."""

    __slots__ = ()


# An escaped NUL that is not itself an escaped backslash followed by "u0000".
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# An escaped surrogate that is not half of a pair (json.dumps escapes a valid pair as two).
_LONE_SURROGATE = re.compile(
    r"(?<!\\)(?:\\\\)*(?:\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f][0-9a-f]{2})"
    r"|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2})"
)


_CANONICAL = json.JSONEncoder(
    allow_nan=False, sort_keys=True, separators=(",", ":"), check_circular=False
)


def _not_json(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _one_shot_encoder() -> Callable[[Any], str]:
    """`_CANONICAL.encode`, without its per-call cost.

    `JSONEncoder.encode` builds a new C encoder on every call, ~1 us of a 1.6-2.7 us encode, and
    it runs for every event's data, meta and JSON projection column. The C encoder (what
    `encode` builds, with the same arguments) is built once here; Python builds without the
    `_json` accelerator use `encode` itself. Cycles are not tracked: a cyclic value raises
    RecursionError (the caller's error), as a value nested too deep does.
    """
    if c_make_encoder is None:  # pragma: no cover - CPython always has _json
        return _CANONICAL.encode
    encoder = c_make_encoder(
        None, _not_json, encode_basestring_ascii, None, ":", ",", True, False, False
    )
    return lambda value: "".join(encoder(value, 0))


_encode = _one_shot_encoder()


def dumps_json(value: Any, *, what: str) -> JsonText:
    """Canonical JSON; NaN, infinities, NUL characters and non-JSON values raise
    EventValidationError (PostgreSQL cannot store NUL in JSON, so no backend accepts it)."""
    try:
        # A bare string (a projection's text column kept as JSON) skips the encoder's setup.
        text = encode_basestring_ascii(value) if type(value) is str else _encode(value)
    except (TypeError, ValueError, RecursionError) as e:
        raise EventValidationError(f"{what} is not JSON: {e}") from e
    if "\\u0000" in text and _NUL.search(text):
        raise EventValidationError(f"{what} contains a NUL character")
    if "\\ud" in text and _LONE_SURROGATE.search(text):
        raise EventValidationError(f"{what} contains a lone surrogate (not valid Unicode)")
    return JsonText(text)


_Scanner = Callable[[str, int], tuple[Any, int]]
_scan: _Scanner = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
"""What `json.loads` ends in (the C scanner where CPython has it), built once."""


def loads_json(text: str) -> Any:
    """`json.loads(text)` for JSON the store wrote, without its three Python calls per value.

    It decodes every event's data and meta read back: a rebuild reads millions. Text that is
    not one bare JSON value (whitespace around it, trailing data, invalid JSON) goes to
    `json.loads` itself, which decodes it or raises its usual error.
    """
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value


def serialize_json(value: Any) -> str:
    """The engines' JSON serializer: pre-serialised JsonText passes through untouched."""
    if isinstance(value, JsonText):
        return value
    return dumps_json(value, what="JSON column value")


def new_event_id() -> str:
    """A fresh random (version 4) UUID, as `str(uuid.uuid4())` writes it.

    Formatted from 16 random bytes directly: a third of the cost of building a `uuid.UUID`, on
    every event appended without an id and every prediction a `RunLog` records.
    """
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}
"""The RFC 4122 variant: the top two bits of the 17th hex digit set to 10."""


# A UUID already in its normal form (as `str(uuid4())` writes it): no need to parse it again.
_NORMAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def check_event_id(event_id: str) -> str:
    """Normalise a caller-provided event id (must be a UUID)."""
    if isinstance(event_id, str) and _NORMAL_UUID.fullmatch(event_id):
        return event_id
    try:
        return str(uuid.UUID(str(event_id)))
    except ValueError as e:
        raise EventValidationError(f"event_id {event_id!r} is not a UUID") from e
