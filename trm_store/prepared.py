"""What a validated append is made of: its events, their ids fixed and their JSON serialised once
(`trm_store.prepare` makes them, `trm_store.append` writes them)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any

__all__ = ["PreparedAppend", "PreparedEvent", "copied", "seal", "sealed_as"]


@dataclass(slots=True)
class PreparedEvent:
    """One validated event, with its id fixed and its JSON serialised once for the insert.

    Made by `Store.prepare`, written by `Store.append_prepared`; treat it as opaque.

    Not frozen: a frozen dataclass costs ~1 us more to build, on every event of every append.
    `seal` is what `Store.prepare` left (`seal`), not a field of the event: left out of its
    equality and of `PreparedAppend`'s columns.
    """

    event_id: str
    type: str
    schema_version: int
    data: dict[str, Any]
    data_json: str
    meta: dict[str, Any]
    meta_json: str
    seal: tuple[object, ...] | None = field(default=None, repr=False, compare=False)


@dataclass(slots=True)
class PreparedAppend:
    """One stream's part of an append, validated (not frozen, as `PreparedEvent`).

    Its events are held as columns, one list a field of `PreparedEvent`, in the events' order:
    an append of many events of one type (`AppendPreparer`) makes no object an event, which
    costs ~0.16 us an event to build and, held while the append waits for the writer, is one
    more object an event for the garbage collector to count (with several threads appending,
    queued appends' objects set off its collections: `bench/writers_bench.py`).
    """

    stream_id: str
    expected_version: int | None
    event_ids: list[str]
    types: list[str]
    schema_versions: list[int]
    datas: list[dict[str, Any]]
    data_jsons: list[str]
    metas: list[dict[str, Any]]
    meta_jsons: list[str]
    ids_given: bool
    """True when the caller chose any of the event ids (a possible retry)."""

    @classmethod
    def of(
        cls,
        stream_id: str,
        expected_version: int | None,
        events: Sequence[PreparedEvent],
        ids_given: bool,
    ) -> PreparedAppend:
        """The append of `events`, each validated alone: their fields transposed into columns
        in C, where a comprehension a field ran seven Python frames an append; one event (most
        appends) read field by field, a list each, where transposing cost ~1 us more."""
        if len(events) == 1:
            (event,) = events
            return cls(
                stream_id,
                expected_version,
                [event.event_id],
                [event.type],
                [event.schema_version],
                [event.data],
                [event.data_json],
                [event.meta],
                [event.meta_json],
                ids_given,
            )
        ids, types, versions, datas, data_jsons, metas, meta_jsons = map(
            list, zip(*map(_EVENT_FIELDS, events), strict=True)
        )
        return cls(
            stream_id,
            expected_version,
            ids,
            types,
            versions,
            datas,
            data_jsons,
            metas,
            meta_jsons,
            ids_given,
        )

    def columns(self) -> Iterator[tuple[str, str, int, dict[str, Any], str, dict[str, Any], str]]:
        """Each event's fields, in `PreparedEvent`'s order."""
        return zip(
            self.event_ids,
            self.types,
            self.schema_versions,
            self.datas,
            self.data_jsons,
            self.metas,
            self.meta_jsons,
            strict=True,
        )

    def events(self) -> list[PreparedEvent]:
        """The events one by one: for what only a failed append looks at (a retry's check)."""
        return [PreparedEvent(*event) for event in self.columns()]


_EVENT_FIELDS = attrgetter(*(f.name for f in fields(PreparedEvent) if f.name != "seal"))
"""A `PreparedEvent`'s fields, in its order: `PreparedAppend`'s columns, as `columns` gives them
back (tests/store/test_prepared_append.py checks each column against its field by name)."""

_PREPARED_HERE = object()
"""Opens every seal this process's `Store.prepare` makes: an event built by hand, or unpickled
in another process, carries none (another object, or no seal)."""


def copied(event: PreparedEvent) -> PreparedEvent:
    """A plain `PreparedEvent` holding `event`'s fields, each read once (`event` may be a
    subclass whose fields are properties, or be changed while it is checked); no seal."""
    return PreparedEvent(*_EVENT_FIELDS(event))


def sealed_as(event: PreparedEvent) -> tuple[object, ...]:
    """The seal `Store.prepare` leaves on `event` as it is now: its fields as written (the data
    and meta as their JSON)."""
    return (
        _PREPARED_HERE,
        event.event_id,
        event.type,
        event.schema_version,
        event.data_json,
        event.meta_json,
    )


def seal(event: PreparedEvent) -> PreparedEvent:
    """`event`, sealed: `append_prepared` takes it as `prepare` left it while its fields still
    match its seal, and validates it again otherwise (`trm_store.prepared_check`)."""
    event.seal = sealed_as(event)
    return event
