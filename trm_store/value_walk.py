"""The walk over a value before it is written as JSON: what pydantic's JSON mode or the encoder
would write wrongly, or not at all, refused first (ValueError, which the callers turn into
EventValidationError): NaN and infinities (written as null), nesting past `MAX_DEPTH` (a cyclic
value: the C encoder would recurse past the C stack), keys that become the same JSON key (a
value lost)."""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Iterable, Mapping
from enum import Enum
from functools import cache
from itertools import chain
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

__all__ = [
    "MAX_DEPTH",
    "NO_MODES",
    "KeyModes",
    "key_modes",
    "refuse_non_finite",
    "refuse_non_finite_in",
]

MAX_DEPTH = 200

KeyModes = tuple[Mapping[str, Any], ...]
"""How the serializers that may write a dict's keys write bytes, timedeltas and dates (their
models' `ser_json_*` settings), as `to_jsonable_python`'s arguments: the event's model and each
model instance on the way down. A model reached through a typed field is written with its
parent's settings, one in an `Any` field with its own; the walk does not tell them apart, so a
key is checked in each form: refused if two keys merge in any, or if it can be written in
none."""
NO_MODES: KeyModes = (MappingProxyType({}),)
_MODES = (
    ("ser_json_bytes", "bytes_mode"),
    ("ser_json_timedelta", "timedelta_mode"),
    ("ser_json_temporal", "temporal_mode"),
)


@cache
def key_modes(model: type) -> Mapping[str, Any]:
    """The `ser_json_*` settings a model (or a pydantic dataclass) sets, for the key check
    (made once per class)."""
    config: Mapping[str, Any] = getattr(model, "model_config", None) or getattr(
        model, "__pydantic_config__", {}
    )
    return MappingProxyType({mode: config[name] for name, mode in _MODES if name in config})


def refuse_non_finite(value: Any, depth: int = 0, keys: KeyModes = NO_MODES) -> None:
    """Raise ValueError for a NaN or infinite float anywhere in `value`, or for nesting deeper
    than `MAX_DEPTH` levels (a cyclic value too: checked before the C encoder, which would
    recurse until the interpreter's limit, and past the C stack when that limit is raised).

    On every append's path: plain scalars are skipped without a call, and the usual containers
    are recognised by their exact type before the slower isinstance checks.
    """
    kind = type(value)
    if kind is dict or (kind is not list and isinstance(value, Mapping)):
        if not all(type(key) is str for key in value):
            _refuse_merged_keys(value, keys)
        items: Iterable[Any] = value.values()
    elif kind is list:
        items = value
    elif kind is float or isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a finite number")
        return
    elif isinstance(value, BaseModel):
        items = chain(value.__dict__.values(), (value.__pydantic_extra__ or {}).values())
        if (own := key_modes(type(value))) not in keys:
            keys = (*keys, own)
    elif isinstance(value, list | tuple | set | frozenset):
        items = value
    else:
        items = _inferred_items(value)
        if not items:  # a datetime, a UUID, a decimal (most of what reaches here): no walk
            return
        dataclass: type = type(value)
        if hasattr(dataclass, "__pydantic_config__") and (own := key_modes(dataclass)) not in keys:
            keys = (*keys, own)  # a pydantic dataclass: written in its own form too
    refuse_non_finite_in(items, depth, keys)


def _inferred_items(value: Any) -> Iterable[Any]:
    """What pydantic writes of `value` where it infers the type (an `Any` field) and the checks
    above do not reach: a dataclass's fields, an enum member's value, a deque's items. Nothing
    for anything else: a value pydantic cannot write it refuses itself, unwalked (a `range` of
    10**18, a collection whose iteration fails). Cheap tests first: most values that reach this
    are datetimes, UUIDs, decimals."""
    if isinstance(value, deque):
        return value
    if isinstance(value, Enum):
        return (value.value,)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [getattr(value, field.name) for field in dataclasses.fields(value)]
    return ()


def refuse_non_finite_in(items: Iterable[Any], depth: int, keys: KeyModes = NO_MODES) -> None:
    """`refuse_non_finite` of each of `items`, the items of containers `depth` levels deep."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
    for item in items:
        kind = type(item)
        if item is None or kind in _PLAIN:
            continue
        if kind is float:  # checked here: a call per float would double the walk's cost
            if not math.isfinite(item):
                raise ValueError(f"{item} is not a finite number")
        elif kind is dict:  # the usual nested container: one call, as for a float
            if not all(type(key) is str for key in item):
                _refuse_merged_keys(item, keys)
            refuse_non_finite_in(item.values(), depth + 1, keys)
        else:
            refuse_non_finite(item, depth + 1, keys)


def _refuse_merged_keys(value: Mapping[Any, Any], modes: KeyModes) -> None:
    """JSON keys are text: `{1: "a", "1": "b"}` would be written as `{"1": "b"}`, a value lost
    (its keys turned to text as pydantic turns them, in an `Any` field, in each of `modes`). A
    NaN or infinite key is refused as such a value is (pydantic writes each as "None"); a key
    that cannot be text in any of `modes` (a `frozenset`) is refused here too."""
    for key in value:
        if isinstance(key, float) and not math.isfinite(key):
            raise ValueError(f"a key {key} is not a finite number")
    written = 0
    problem: Exception | None = None
    for mode in modes:
        try:
            keys = to_jsonable_python(dict.fromkeys(value), **mode)
        except (TypeError, ValueError) as e:
            problem = e
            continue
        if len(keys) != len(value):
            raise ValueError(
                f"keys {list(value)!r:.80} become the same JSON key: a value would be lost"
            )
        written += 1
    if not written:
        raise ValueError(f"a key of {list(value)!r:.80} cannot be a JSON key: {problem}")


_PLAIN = frozenset({str, int, bool})
