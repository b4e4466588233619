"""The append algorithm: one transaction under the writer lock that checks stream versions,
numbers the events, inserts them and applies the projections inline; and its idempotence (a
retried append whose event ids are all recorded returns the recorded events).

Input arrives validated (`trm_store.prepare`), so nothing here refuses data: a failure is a
version conflict, a retry, or the database's.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from trm_store.backend import Backend, reading, store_error
from trm_store.driver import DriverSql, bind_processor, execute_many
from trm_store.errors import ConcurrencyError, EventValidationError
from trm_store.events import RecordedEvent, recorded_event
from trm_store.log import events_by_id, heads, stream_head
from trm_store.prepare import PreparedAppend
from trm_store.projection_runner import ProjectionSet
from trm_store.schema import EVENT_COLUMNS, EVENTS

__all__ = ["INSERT_EVENTS", "Appender"]

INSERT_EVENTS = DriverSql(
    f"INSERT INTO events ({', '.join(EVENT_COLUMNS)}) "
    f"VALUES ({', '.join(':' + name for name in EVENT_COLUMNS)})"
)
"""The event rows of an append, sent with one `executemany` (`trm_store.driver`): JSON
already serialised, `recorded_at` through its column type's `bind_processor`."""

_RESEND = "a retried append must resend exactly the same events"


class _EventIdTaken(Exception):
    """An event id of the append is in the log already; the transaction rolled back."""


class Appender:
    """Appends validated events to one store's log, in one transaction per call."""

    def __init__(self, backend: Backend, projections: ProjectionSet) -> None:
        self._backend = backend
        self._projections = projections
        self._stored_time = bind_processor(EVENTS.c.recorded_at, backend.engine.dialect)

    def append(self, prepared: Sequence[PreparedAppend]) -> list[RecordedEvent]:
        """Write `prepared` (all of it, or nothing); the recorded events, in position order."""
        try:
            with self._backend.append_transaction() as conn:
                return self._append_locked(conn, prepared)
        except SQLAlchemyError as e:
            raise store_error(self._backend, e) from e
        except (ConcurrencyError, _EventIdTaken) as e:
            # Optimistic idempotence: only a failed append pays for looking its ids up.
            recorded = self._already_recorded(prepared)
            if recorded is not None:
                return recorded
            if isinstance(e, ConcurrencyError):
                raise
            raise EventValidationError(
                f"some of these event ids are recorded already: {_RESEND}"
            ) from None

    def _already_recorded(self, prepared: Sequence[PreparedAppend]) -> list[RecordedEvent] | None:
        """The recorded events if every caller-given id of this append is in the log, else None.

        Raises EventValidationError when only some of them are.
        """
        if not any(p.ids_given for p in prepared):
            return None
        ids = [e.event_id for p in prepared for e in p.events]
        with reading(self._backend) as conn:
            found = events_by_id(conn, ids)
        if not found:
            return None
        if len(found) < len(ids):
            raise EventValidationError(
                f"{len(found)} of {len(ids)} event ids are recorded already: {_RESEND}"
            )
        return [found[eid] for eid in ids]

    def _append_locked(
        self, conn: Connection, prepared: Sequence[PreparedAppend]
    ) -> list[RecordedEvent]:
        previous_head, first_version = heads(conn, prepared[0].stream_id)
        position = previous_head
        versions: dict[str, int] = {prepared[0].stream_id: first_version}
        now = datetime.now(UTC)
        stored_now = now if self._stored_time is None else self._stored_time(now)
        rows: list[dict[str, Any]] = []
        recorded: list[RecordedEvent] = []
        for item in prepared:
            stream_id = item.stream_id
            if stream_id not in versions:
                versions[stream_id] = stream_head(conn, stream_id)
            current = versions[stream_id]
            if item.expected_version is not None and item.expected_version != current:
                raise ConcurrencyError(stream_id, item.expected_version, current)
            for event in item.events:
                position += 1
                current += 1
                rows.append(
                    {
                        "position": position,
                        "event_id": event.event_id,
                        "stream_id": stream_id,
                        "stream_version": current,
                        "type": event.type,
                        "schema_version": event.schema_version,
                        "data": event.data_json,
                        "meta": event.meta_json,
                        "recorded_at": stored_now,
                    }
                )
                recorded.append(
                    recorded_event(
                        position,
                        event.event_id,
                        stream_id,
                        current,
                        event.type,
                        event.schema_version,
                        event.data,
                        event.meta,
                        now,
                    )
                )
            versions[stream_id] = current
        try:
            execute_many(conn, INSERT_EVENTS, rows)
        except IntegrityError as e:
            if "event_id" in str(e.orig):
                raise _EventIdTaken from e
            raise
        self._projections.apply_inline(conn, previous_head, position, recorded)
        return recorded
