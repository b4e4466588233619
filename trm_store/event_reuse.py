"""Telling a retried append from any other use of its event ids.

An event id names one event. An append whose ids are recorded is a retry when it resends exactly
the events recorded under them: each on the same stream, with the same type, data and meta
(compared as the JSON the log holds; the origin, host and pid, is where an event was written from,
not what it says, so it is left out). The recorded events are then its answer, and nothing is
written: exactly-once. Anything else is refused: an id on another stream, type, data or meta, an
append that resends only some of the events of its ids (the rest would be written as new events
next to the old ones), and an append that uses one id twice.

Only an append that failed (an id taken: the unique index refused the insert; or a stream not at
the expected version) is compared, so the check costs a successful append nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trm_store.errors import EventIdConflictError
from trm_store.events import RecordedEvent
from trm_store.json_codec import loads_json, same_json
from trm_store.prepare import ORIGIN_KEYS
from trm_store.prepared import PreparedAppend, PreparedEvent

__all__ = ["duplicate_id", "event_ids", "retried"]


def event_ids(prepared: Sequence[PreparedAppend]) -> list[str]:
    """Every event id of the append, in order."""
    return [event_id for item in prepared for event_id in item.event_ids]


def duplicate_id(prepared: Sequence[PreparedAppend]) -> str | None:
    """A message naming an event id the append itself uses twice, else None."""
    seen: dict[str, str] = {}
    for item in prepared:
        for n, event_id in enumerate(item.event_ids, 1):
            where = f"event {n} of stream {item.stream_id!r}"
            first = seen.setdefault(event_id, where)
            if first is not where:
                return (
                    f"event_id {event_id} appears twice in one append ({first} and "
                    f"{where}): each event needs its own id; nothing was written"
                )
    return None


def retried(
    prepared: Sequence[PreparedAppend], recorded: Mapping[str, RecordedEvent]
) -> list[RecordedEvent] | None:
    """The recorded events, in the append's order, when `prepared` resends exactly them; None
    when none of its ids is recorded. Any other use of a recorded id raises EventIdConflictError.

    `recorded`: the events of the log among the append's ids, by id.
    """
    if not recorded:
        return None
    for item in prepared:
        for event in item.events():
            stored = recorded.get(event.event_id)
            if stored is None:
                continue
            why = _difference(stored, item.stream_id, event)
            if why is not None:
                raise EventIdConflictError(stored.event_id, stored.stream_id, stored.version, why)
    ids = event_ids(prepared)
    if len(recorded) < len(ids):
        first = next(recorded[event_id] for event_id in ids if event_id in recorded)
        raise EventIdConflictError(
            first.event_id,
            first.stream_id,
            first.version,
            f"this append resends it with {len(ids) - len(recorded)} of its {len(ids)} events "
            "new to the log (a retry resends the whole append, and only it)",
        )
    return [recorded[event_id] for event_id in ids]


def _difference(stored: RecordedEvent, stream_id: str, event: PreparedEvent) -> str | None:
    """How `event`, appended to `stream_id`, differs from the event recorded under its id."""
    if stored.stream_id != stream_id:
        return f"this append puts it on stream {stream_id!r}"
    if stored.type != event.type:
        return f"this append gives it type {event.type!r}, the log has {stored.type!r}"
    if not same_json(stored.data, loads_json(event.data_json)):
        return "this append gives it other data"
    if not same_json(_said(stored.meta), _said(loads_json(event.meta_json))):
        return "this append gives it other meta"
    return None


def _said(meta: dict[str, Any]) -> dict[str, Any]:
    """The meta without its origin: what the event says, not where it was written from."""
    return {key: value for key, value in meta.items() if key not in ORIGIN_KEYS}
