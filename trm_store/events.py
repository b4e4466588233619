"""Event values: an event to append (`NewEvent`) and an event as stored (`RecordedEvent`).

`register_event_type` (defined in `trm_store.event_types`) is also reachable here, next to the
values it types: domain modules import the three names from one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from trm_store.event_types import register_event_type

__all__ = ["NewEvent", "RecordedEvent", "recorded_event", "register_event_type"]


@dataclass(frozen=True, slots=True, init=False)
class NewEvent:
    """An event to append. `event_id` makes a retried append exactly-once; None draws a UUID.

    `data` is a mapping, or an instance of the type's registered model (validated already).
    """

    type: str
    data: Mapping[str, Any] | BaseModel
    meta: Mapping[str, Any] | None = None
    event_id: str | None = None

    def __init__(
        self,
        type: str,
        data: Mapping[str, Any] | BaseModel,
        meta: Mapping[str, Any] | None = None,
        event_id: str | None = None,
    ) -> None:
        # The generated __init__ of a frozen dataclass, at 0.6 of its cost (timeit: 220 against
        # 357 ns), for every event appended: each field set through its slot's descriptor, as
        # `object.__setattr__` does after looking it up (`_slot_setters`).
        _set_type(self, type)
        _set_data(self, data)
        _set_meta(self, meta)
        _set_event_id(self, event_id)


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


def _slot_setters(cls: type) -> list[Callable[[object, Any], None]]:
    """The `__set__` of each of `cls`'s slot descriptors, in `__slots__` order: what a frozen
    dataclass's generated `__init__` ends in, without its `object.__setattr__` lookups.
    `tests/store/test_canaries.py` checks that the slots are the fields, in order, with their
    defaults, and no `__post_init__`."""
    return [getattr(cls, name).__set__ for name in cls.__slots__]  # type: ignore[attr-defined]


_set_type, _set_data, _set_meta, _set_event_id = _slot_setters(NewEvent)


def _recorded_event_constructor() -> Callable[..., RecordedEvent]:
    """`RecordedEvent(...)`, positional, at under half its cost: for every event read or appended.

    A frozen dataclass's `__init__` sets each field with `object.__setattr__` (timeit: 700 ns
    an event, or as much through the slots' descriptors). This builds the event as an instance
    of a twin: a plain dataclass with the same fields, whose `__init__` stores each one in its
    slot directly, then makes it a RecordedEvent by assigning `__class__`, which Python allows
    between classes of the same layout and refuses with TypeError otherwise (~320 ns). The twin
    is made from RecordedEvent's own fields; `tests/store/test_canaries.py` checks that they are
    its whole `__init__` (no defaults, no `__post_init__`) and that the result is a RecordedEvent
    equal to one built by its `__init__`. A rebuild builds a million of them. Measured on the
    GIL build only: on a free-threaded one (3.13t) `__class__` assignment may pause the other
    threads (CPython gh-120198).
    """
    twin = dataclasses.make_dataclass(
        "_RecordedEventBuilt",
        [(field.name, field.type) for field in dataclasses.fields(RecordedEvent)],
        slots=True,
    )
    recorded = RecordedEvent

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
        event = twin(p, e, s, v, t, sv, d, m, a)
        event.__class__ = recorded
        return event  # type: ignore[no-any-return]

    return recorded_event


recorded_event = _recorded_event_constructor()
