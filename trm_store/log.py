"""Reading the event log: one place turns rows into `RecordedEvent`s (upcasting old schemas)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, bindparam, text

from trm_store.driver import DriverSql, fetch_all, padded_in
from trm_store.event_types import registered_event_types
from trm_store.events import RecordedEvent, recorded_event
from trm_store.json_codec import loads_json
from trm_store.log_filter import LogFilter
from trm_store.schema import EVENT_COLUMNS
from trm_store.vocabulary import INT64_MAX

__all__ = [
    "LogBatch",
    "events_after",
    "events_by_id",
    "head",
    "log_batch",
    "read_batches",
    "stream_events",
    "stream_head",
    "stream_heads",
]

_SELECT = f"SELECT {', '.join(EVENT_COLUMNS)} FROM events"
"""Every read of the log selects the raw columns: `_recorded` decodes them, in one place."""


def _utc(at: str | datetime) -> datetime:
    """`recorded_at` as read back, aware: naive values are UTC (SQLAlchemy's SQLite text).

    Parsed with the offset appended: `replace(tzinfo=UTC)` costs ten times the parse.
    """
    if isinstance(at, str):
        try:
            return datetime.fromisoformat(at + "+00:00")
        except ValueError:  # text that carries its own offset
            at = datetime.fromisoformat(at)
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _is_flat(value: Any) -> bool:
    """A dict whose values are all scalars: a shallow copy of it is a full copy."""
    return type(value) is dict and all(type(v) in _SCALARS for v in value.values())


def _recorded(conn: Connection, rows: Iterable[Sequence[Any]]) -> list[RecordedEvent]:
    """`conn`'s stored rows as RecordedEvents, their data upcast to the registered schema
    version.

    The rows are what the driver returns: on SQLite, JSON as text and `recorded_at` as
    SQLAlchemy's naive UTC text; on PostgreSQL, decoded JSON and aware datetimes. Decoding here
    instead of in SQLAlchemy's result processors halves the cost of reading an event, the bulk
    of a rebuild. Text is decoded on SQLite only: on PostgreSQL a `str` is a decoded JSON
    string (data trm refuses now, but an older trm wrote), which decoded again would read back
    as another value, or fail.
    """
    text_json = conn.dialect.name == "sqlite"
    types = registered_event_types()
    recorded = []
    meta_text: str | None = None
    flat_meta: dict[str, Any] | None = None
    """The last meta decoded, when its values are all scalars: a copy of it is a decode."""
    for position, event_id, stream_id, version, type_, schema_version, data, meta, at in rows:
        if text_json:
            data = loads_json(data)
            # Consecutive events mostly share their meta (the writer's host and pid). Each
            # event gets its own copy: a caller may change its event's meta.
            if meta == meta_text and flat_meta is not None:
                meta = dict(flat_meta)
            else:
                meta_text, meta = meta, loads_json(meta)
                flat_meta = meta if _is_flat(meta) else None
        at = _utc(at)
        registered = types.get(type_)
        if registered is not None and schema_version != registered.schema_version:
            data = registered.read(schema_version, data)
            schema_version = registered.schema_version
        recorded.append(
            recorded_event(
                position, event_id, stream_id, version, type_, schema_version, data, meta, at
            )
        )
    return recorded


# Built once, as plain SQL, so no statement is compiled per call.
_HEAD = text("SELECT coalesce(max(position), 0) FROM events")
_STREAM_HEAD = DriverSql("SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = :s")


def head(conn: Connection) -> int:
    """The last position in the log (0 when empty)."""
    return int(conn.execute(_HEAD).scalar_one())


def stream_head(conn: Connection, stream_id: str) -> int:
    """The stream's current version (0 when it does not exist), sent to the driver as an
    append's heads are (`trm_store.append_heads`)."""
    ((version,),) = fetch_all(conn, _STREAM_HEAD, {"s": stream_id})
    return int(version)


_STREAM_HEADS: dict[int, DriverSql] = {}
"""`stream_heads`' statement by the size of its padded IN list."""


def stream_heads(conn: Connection, stream_ids: Sequence[str]) -> dict[str, int]:
    """The current version of each of `stream_ids`, `_STREAMS_PER_QUERY` at a time (one row per
    existing stream, from the (stream_id, stream_version) index): an append to many streams."""
    versions = dict.fromkeys(stream_ids, 0)
    for k in range(0, len(stream_ids), _STREAMS_PER_QUERY):
        size, params = padded_in(stream_ids[k : k + _STREAMS_PER_QUERY])
        statement = _STREAM_HEADS.get(size)
        if statement is None:
            names = ", ".join(f":i{n}" for n in range(size))
            statement = _STREAM_HEADS[size] = DriverSql(
                f"SELECT stream_id, max(stream_version) FROM events WHERE stream_id IN ({names})"
                " GROUP BY stream_id"
            )
        versions.update(
            (stream, int(version)) for stream, version in fetch_all(conn, statement, params)
        )
    return versions


_STREAMS_PER_QUERY = 512
"""Under every backend's limit on a statement's parameters (SQLite's oldest: 999)."""


_AFTER = {
    bounded: DriverSql(
        f"{_SELECT} WHERE position > :after{' AND position <= :until' if bounded else ''}"
        " ORDER BY position LIMIT :limit"
    )
    for bounded in (False, True)
}
_OF_STREAM = {
    backwards: DriverSql(
        f"{_SELECT} WHERE stream_id = :s AND stream_version {'<=' if backwards else '>='} :v"
        f" ORDER BY stream_version{' DESC' if backwards else ''} LIMIT :limit"
    )
    for backwards in (False, True)
}
"""Both directions are one range of the (stream_id, stream_version) index."""
_BY_ID = text(f"{_SELECT} WHERE event_id IN :ids").bindparams(bindparam("ids", expanding=True))


def events_after(
    conn: Connection,
    after: int,
    limit: int,
    *,
    types: Collection[str] | None = None,
    until: int | None = None,
) -> list[RecordedEvent]:
    """Up to `limit` events with position > `after` (and <= `until`), optionally of `types` only.

    Read on the driver (`trm_store.driver`): a rebuild and `read_all` read the whole log here.
    """
    if types is not None:
        last = until if until is not None else INT64_MAX
        return filtered_after(conn, LogFilter.of(types, None), after, last, limit)
    if until is None:
        return _recorded(conn, fetch_all(conn, _AFTER[False], {"after": after, "limit": limit}))
    params = {"after": after, "until": until, "limit": limit}
    return _recorded(conn, fetch_all(conn, _AFTER[True], params))


def filtered_after(
    conn: Connection, log_filter: LogFilter | None, after: int, until: int, limit: int
) -> list[RecordedEvent]:
    """Up to `limit` events matching `log_filter` with position in (after, until]."""
    if log_filter is None:
        return events_after(conn, after, limit, until=until)
    statement = log_filter.statement(_SELECT, until - after, limit)
    return _recorded(conn, fetch_all(conn, statement, log_filter.params(after, until, limit)))


class LogBatch(NamedTuple):
    """A batch of a log read and where the next one starts."""

    events: list[RecordedEvent]
    cursor: int
    """Every matching event up to here is in this batch or an earlier one."""
    complete: bool
    """Fewer than the batch size: the read caught up with the snapshot's head."""


def log_batch(conn: Connection, log_filter: LogFilter | None, after: int, limit: int) -> LogBatch:
    """The next `limit` matching events after `after`, read in one snapshot (`conn`'s
    transaction).

    Readers see a prefix of the log's positions (they are numbered in commit order, gap-free),
    so the head read in the same snapshot bounds what this batch could have missed: nothing.
    A filtered read that comes back short moves the cursor to that head, so the next read does
    not scan again what matched nothing.
    """
    if log_filter is None:
        events = events_after(conn, after, limit)
        cursor = events[-1].position if events else after
        return LogBatch(events, cursor, len(events) < limit)
    until = head(conn)
    events = filtered_after(conn, log_filter, after, until, limit)
    if len(events) < limit:
        return LogBatch(events, max(after, until), True)
    return LogBatch(events, events[-1].position, False)


def read_batches(
    reading: Callable[[], AbstractContextManager[Connection]],
    log_filter: LogFilter | None,
    after: int,
    batch_size: int,
) -> Iterator[RecordedEvent]:
    """`Store.read_all`: `log_batch` after batch, each in a read transaction of its own (so a
    long read holds no snapshot between batches), until a batch says the log is read."""
    while True:
        with reading() as conn:
            batch = log_batch(conn, log_filter, after, batch_size)
        yield from batch.events
        if batch.complete:
            return
        after = batch.cursor


def stream_events(
    conn: Connection, stream_id: str, from_version: int, *, backwards: bool, limit: int
) -> list[RecordedEvent]:
    """Up to `limit` events of one stream from version `from_version` on, in version order
    (`backwards`: from `from_version` down, newest first)."""
    params = {"s": stream_id, "v": from_version, "limit": limit}
    return _recorded(conn, fetch_all(conn, _OF_STREAM[backwards], params))


def events_by_id(conn: Connection, event_ids: Collection[str]) -> dict[str, RecordedEvent]:
    """Already recorded events among `event_ids`, by id."""
    rows = conn.execute(_BY_ID, {"ids": sorted(event_ids)})
    return {e.event_id: e for e in _recorded(conn, rows)}
