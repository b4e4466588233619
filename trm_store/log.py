"""Reading the event log: one place turns rows into `RecordedEvent`s (upcasting old schemas)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Result, Row, select, text

from trm_store.driver import DriverSql, fetch_all
from trm_store.events import EventType, RecordedEvent, registered_event_types
from trm_store.schema import EVENTS

__all__ = [
    "events_after",
    "events_by_id",
    "head",
    "heads",
    "stream_events",
    "stream_head",
    "to_recorded",
]

_COLUMNS = (
    EVENTS.c.position,
    EVENTS.c.event_id,
    EVENTS.c.stream_id,
    EVENTS.c.stream_version,
    EVENTS.c.type,
    EVENTS.c.schema_version,
    EVENTS.c.data,
    EVENTS.c.meta,
    EVENTS.c.recorded_at,
)


def to_recorded(
    row: Row[*tuple[Any, ...]], types: Mapping[str, EventType] | None = None
) -> RecordedEvent:
    """A stored row as a RecordedEvent, its data upcast to the registered schema version.

    `types` is the registry of event types; `_recorded` looks it up once per batch of rows.
    """
    position, event_id, stream_id, version, type_, schema_version, data, meta, at = row
    registered = (registered_event_types() if types is None else types).get(type_)
    if registered is not None and schema_version != registered.schema_version:
        data = registered.read(schema_version, data)
        schema_version = registered.schema_version
    recorded_at: datetime = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    return RecordedEvent(
        position, event_id, stream_id, version, type_, schema_version, data, meta, recorded_at
    )


def _recorded(result: Result[Any]) -> list[RecordedEvent]:
    """Every row of `result` (fetched at once) as a RecordedEvent."""
    types = registered_event_types()
    return [to_recorded(row, types) for row in result.all()]


# Built once, as plain SQL, so no statement is compiled per call.
_HEAD = text("SELECT coalesce(max(position), 0) FROM events")
_STREAM_HEAD = DriverSql("SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = :s")


_HEADS = DriverSql(
    "SELECT (SELECT coalesce(max(position), 0) FROM events),"
    " (SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = :s)"
)


def heads(conn: Connection, stream_id: str) -> tuple[int, int]:
    """(the log's head, the stream's version) in one round trip: an append needs both.

    Sent straight to the driver: it runs in every append (see `trm_store.driver`).
    """
    ((log_head, stream_version),) = fetch_all(conn, _HEADS, {"s": stream_id})
    return int(log_head), int(stream_version)


def head(conn: Connection) -> int:
    """The last position in the log (0 when empty)."""
    return int(conn.execute(_HEAD).scalar_one())


def stream_head(conn: Connection, stream_id: str) -> int:
    """The stream's current version (0 when it does not exist); on the driver, as `heads`."""
    ((version,),) = fetch_all(conn, _STREAM_HEAD, {"s": stream_id})
    return int(version)


def events_after(
    conn: Connection,
    after: int,
    limit: int,
    *,
    types: Collection[str] | None = None,
    until: int | None = None,
) -> list[RecordedEvent]:
    """Up to `limit` events with position > `after` (and <= `until`), optionally of `types` only."""
    query = select(*_COLUMNS).where(EVENTS.c.position > after)
    if until is not None:
        query = query.where(EVENTS.c.position <= until)
    if types is not None:
        query = query.where(EVENTS.c.type.in_(sorted(types)))
    query = query.order_by(EVENTS.c.position).limit(limit)
    return _recorded(conn.execute(query))


def stream_events(conn: Connection, stream_id: str, from_version: int) -> list[RecordedEvent]:
    """The events of one stream from `from_version` on."""
    query = (
        select(*_COLUMNS)
        .where(EVENTS.c.stream_id == stream_id, EVENTS.c.stream_version >= from_version)
        .order_by(EVENTS.c.stream_version)
    )
    return _recorded(conn.execute(query))


def events_by_id(conn: Connection, event_ids: Collection[str]) -> dict[str, RecordedEvent]:
    """Already recorded events among `event_ids`, by id."""
    query = select(*_COLUMNS).where(EVENTS.c.event_id.in_(sorted(event_ids)))
    return {e.event_id: e for e in _recorded(conn.execute(query))}
