"""Validation of an append, complete before any database work, so bad input writes nothing."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any

from trm_store.append_args import AppendItem, check_target, non_empty_list
from trm_store.errors import EventValidationError
from trm_store.event_ids import check_event_id, new_event_id, new_event_ids
from trm_store.event_types import Together, event_type
from trm_store.events import NewEvent
from trm_store.json_codec import dumps_json, dumps_json_all, loads_json
from trm_store.prepared import PreparedAppend, PreparedEvent
from trm_store.prepared_check import as_prepared
from trm_store.value_walk import refuse_non_finite

__all__ = [
    "ORIGIN_KEYS",
    "AppendPreparer",
    "origin",
    "prepared_append",
]

ORIGIN_KEYS = frozenset({"host", "pid"})
"""What `origin` puts in every event's meta: where the event was written from, not what it
says, so a retry from another process resends the same event (`trm_store.event_reuse`)."""


def origin() -> dict[str, Any]:
    """This process's origin (host, pid), for `AppendPreparer`."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


class AppendPreparer:
    """Turns append items into validated events with their JSON serialised once; every event
    carries `origin` (host, pid) in its meta."""

    def __init__(self, origin: dict[str, Any]) -> None:
        self._origin = origin
        self._origin_json = dumps_json(origin, what="event meta")

    def __call__(self, item: AppendItem) -> PreparedAppend:
        """Validate one append item completely, before any database work."""
        stream_id, events, expected_version = item
        stream_id, expected_version = check_target(stream_id, expected_version)
        listed = non_empty_list(events, refused=(NewEvent,))
        if listed is None:
            raise EventValidationError(
                f"stream {stream_id!r}: events must be a non-empty list of NewEvent"
            )
        events = listed
        if len(events) == 1:  # most appends
            (new,) = events
            if type(new) is NewEvent and new.event_id is None and new.meta is None:
                return self._one(stream_id, expected_version, new)
            prepared_event = self.event(new, stream_id)
            return PreparedAppend.of(
                stream_id, expected_version, [prepared_event], new.event_id is not None
            )
        validated = _validated_together(events)
        if validated is not None:
            schema_version, together = validated
            normals = together.normals
            usual = self._usual(stream_id, expected_version, events, schema_version, together)
            if usual is not None:
                return usual
            # The caller chose ids (a retry, most likely) or meta: each event is looked at.
            ids_given = any(new.event_id is not None for new in events)
            fresh = [None] * len(events) if ids_given else new_event_ids(len(events))
            prepared = [
                self._validated(new, new.type, schema_version, normal, fresh_id)
                for new, normal, fresh_id in zip(events, normals, fresh, strict=True)
            ]
            return PreparedAppend.of(stream_id, expected_version, prepared, ids_given)
        # Each validated alone.
        prepared = [self.event(new, stream_id) for new in events]
        ids_given = any(new.event_id is not None for new in events)
        return PreparedAppend.of(stream_id, expected_version, prepared, ids_given)

    def _usual(
        self,
        stream_id: str,
        expected_version: int | None,
        events: Sequence[NewEvent],
        schema_version: int,
        together: Together,
    ) -> PreparedAppend | None:
        """The append of `events` (of one type, validated together: their normal forms
        `together`) when none has an id or meta of its own, which is what most appends of many
        events are: their ids drawn at once, their meta the origin, their JSON serialised in one
        loop. None otherwise, or when any data is not JSON (`_validated` then says which)."""
        for new in events:
            if new.event_id is not None or new.meta is not None:
                return None
        normals = together.normals
        try:
            data_jsons = dumps_json_all(normals, what="data", keys_sorted=together.keys_sorted)
        except EventValidationError:
            return None
        count = len(events)
        return PreparedAppend(
            stream_id,
            expected_version,
            new_event_ids(count),
            [events[0].type] * count,
            [schema_version] * count,
            normals,
            data_jsons,
            list(map(dict.copy, repeat(self._origin, count))),  # each its own, as in `_validated`
            [self._origin_json] * count,
            ids_given=False,
        )

    def _one(self, stream_id: str, expected_version: int | None, new: NewEvent) -> PreparedAppend:
        """The append of one `NewEvent` (its class exactly: each field read once all the same)
        with no id or meta of its own, the usual append: its columns built at once, as
        `_usual` builds many events', with no `PreparedEvent` to transpose (an append
        prepared: 4.8 against 5.0 us, timeit)."""
        registered = event_type(new.type)
        type_name = registered.name  # the registry's own text, whatever object named it
        data = registered.validate(new.data)
        return PreparedAppend(
            stream_id,
            expected_version,
            [new_event_id()],
            [type_name],
            [registered.schema_version],
            [data],
            [_data_json(data, type_name)],
            [self._origin.copy()],  # its own, as in `_validated`
            [self._origin_json],
            ids_given=False,
        )

    def event(self, new: NewEvent, stream_id: str | None = None) -> PreparedEvent:
        """Validate one event completely and fix its id (drawn now, when it has none)."""
        if not isinstance(new, NewEvent):
            where = "" if stream_id is None else f"stream {stream_id!r}: "
            raise EventValidationError(f"{where}expected NewEvent, got {type(new).__name__}")
        registered = event_type(new.type)  # read once: the type validated is the type written
        return self._validated(
            new, registered.name, registered.schema_version, registered.validate(new.data)
        )

    def _validated(
        self,
        new: NewEvent,
        type_name: str,
        schema_version: int,
        data: dict[str, Any],
        fresh_id: str | None = None,
    ) -> PreparedEvent:
        """The event of type `type_name` whose data `data` is validated already (the normal
        form of `new.data`), its JSON serialised and its meta and id checked; `fresh_id`: the id
        it gets if it has none (else one is drawn now). Each field of `new` is read once (a
        subclass's property could give another value at each read)."""
        data_json = _data_json(data, type_name)
        given_meta, given_id = new.meta, new.event_id
        if given_meta is None:  # each event its own meta: a caller may change a recorded one
            meta, meta_json = self._origin.copy(), self._origin_json
        elif isinstance(given_meta, Mapping):
            # As the log holds it (a tuple reads back as a list, an int key as a string), and
            # none of the caller's objects: what `append` returns and the projections are given
            # is what a read, and a rebuild, get. Its text is written again from it: int keys
            # were sorted as numbers, as strings they sort as text.
            meta = loads_json(_meta_json({**self._origin, **given_meta}, type_name))
            meta_json = dumps_json(meta, what=f"event {type_name!r} meta")
        else:
            raise EventValidationError(f"event {type_name!r}: meta must be a mapping")
        if given_id is not None:
            event_id = check_event_id(given_id)
        else:
            event_id = new_event_id() if fresh_id is None else fresh_id
        return PreparedEvent(event_id, type_name, schema_version, data, data_json, meta, meta_json)


def _data_json(data: dict[str, Any], type_name: str) -> str:
    """The canonical JSON of an event's validated data; EventValidationError, naming its type,
    for what is no JSON (the message built only then: this runs for every event)."""
    try:
        return dumps_json(data, what="data")
    except EventValidationError as e:
        raise EventValidationError(f"event {type_name!r} {e}") from None


def _meta_json(meta: dict[str, Any], event_type_name: str) -> str:
    """The canonical JSON of an event's meta; EventValidationError for what is no JSON, and
    for nesting past `refuse_non_finite`'s depth (a cyclic meta), looked for first."""
    what = f"event {event_type_name!r} meta"
    try:
        refuse_non_finite(meta)
    except (ValueError, RecursionError) as e:
        raise EventValidationError(f"{what} is not JSON: {e}") from None
    return dumps_json(meta, what=what)


def _validated_together(events: Sequence[Any]) -> tuple[int, Together] | None:
    """The schema version of the events' type and the normal forms of their data, validated in
    one call (`EventType.validate_together`), when they are two or more NewEvents of one
    registered type whose data are plain dicts (an append of predictions, of LLM calls);
    otherwise None, and each event is validated alone."""
    if len(events) < 2 or type(first := events[0]) is not NewEvent:
        return None
    kind = first.type
    if type(kind) is not str:  # a subclass's `!=` could call another type this one
        return None
    for new in events:
        if (
            type(new) is not NewEvent
            or type(new.data) is not dict
            or (new.type is not kind and (type(new.type) is not str or new.type != kind))
        ):
            return None
    try:
        registered = event_type(kind)
    except EventValidationError:
        return None  # each event's own check says so
    together = registered.validate_together([new.data for new in events])
    return None if together is None else (registered.schema_version, together)


def prepared_append(
    stream_id: str,
    events: Sequence[PreparedEvent],
    expected_version: int | None,
    *,
    exposed: bool = True,
) -> PreparedAppend:
    """An append of events validated earlier (`AppendPreparer.event`). Their ids were fixed
    then, so it is treated as a possible retry, as an append with caller-given ids.

    Not validated again, but each is checked to be as `prepare` left it (`as_prepared`): a
    `PreparedEvent` is a plain mutable object, and the log keeps forever what is written. Not
    when not `exposed`: events no code but the writer that prepared them has held (`RunLog`'s;
    `prepare` keeps none of its caller's objects), where it cost ~4.5 us a prediction."""
    stream_id, expected_version = check_target(stream_id, expected_version)
    listed = non_empty_list(events)
    if listed is None:
        raise EventValidationError(
            f"stream {stream_id!r}: events must be a non-empty list of PreparedEvent"
        )
    checked = []
    for given in listed:
        if not isinstance(given, PreparedEvent):
            raise EventValidationError(
                f"stream {stream_id!r}: expected a PreparedEvent (from Store.prepare), got "
                f"{type(given).__name__}"
            )
        checked.append(as_prepared(given) if exposed else given)
    return PreparedAppend.of(stream_id, expected_version, checked, ids_given=True)
