"""The append algorithm: one transaction under the writer lock that checks stream versions,
numbers the events, inserts them and applies the projections inline; and its idempotence (a
retried append returns the recorded events; `trm_store.event_reuse` tells a retry from any other
use of a recorded id).

Input arrives validated (`trm_store.prepare`), so nothing here refuses data: a failure is a
version conflict, a retry, an event id used for another event, or the database's.
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
from trm_store.event_reuse import duplicate_id, event_ids, retried
from trm_store.events import RecordedEvent, recorded_event
from trm_store.log import events_by_id, stream_head
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


class _EventIdTaken(Exception):
    """An event id of the append is in the log already, or twice in the append: the unique
    index refused the insert and the transaction rolled back."""

    def __init__(self, error: IntegrityError) -> None:
        super().__init__(str(error))
        self.error = error


class Appender:
    """Appends validated events to one store's log, in one transaction per call."""

    def __init__(self, backend: Backend, projections: ProjectionSet) -> None:
        self._backend = backend
        self._projections = projections
        self._stored_time = bind_processor(EVENTS.c.recorded_at, backend.engine.dialect)

    def append(self, prepared: Sequence[PreparedAppend]) -> list[RecordedEvent]:
        """Write `prepared` (all of it, or nothing); the recorded events, in position order.

        A retry of an append that was recorded returns the recorded events; any other use of a
        recorded id raises EventIdConflictError (`trm_store.event_reuse`).
        """
        try:
            with self._backend.append_transaction(prepared[0].stream_id) as started:
                return self._append_locked(*started, prepared)
        except SQLAlchemyError as e:
            raise store_error(self._backend, e) from e
        except ConcurrencyError:
            # A stream moved: a retry of a recorded append, when the caller chose its ids.
            if not any(p.ids_given for p in prepared):
                raise
            recorded = self._retried(prepared)
            if recorded is None:
                raise
            return recorded
        except _EventIdTaken as e:
            recorded = self._retried(prepared)
            if recorded is None:  # not reached: the log only grows, so the taken id is there
                raise store_error(self._backend, e.error) from e.error
            return recorded

    def _retried(self, prepared: Sequence[PreparedAppend]) -> list[RecordedEvent] | None:
        """The recorded events if `prepared` resends exactly them, None if none of its ids is
        recorded; EventValidationError for an id used twice in it, EventIdConflictError for any
        other use of a recorded id. Only a failed append pays for this lookup."""
        duplicate = duplicate_id(prepared)
        if duplicate is not None:
            raise EventValidationError(duplicate)
        with reading(self._backend) as conn:
            recorded = events_by_id(conn, event_ids(prepared))
        return retried(prepared, recorded)

    def _append_locked(
        self,
        conn: Connection,
        previous_head: int,
        first_version: int,
        prepared: Sequence[PreparedAppend],
    ) -> list[RecordedEvent]:
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
                raise _EventIdTaken(e) from e
            raise
        self._projections.apply_inline(conn, previous_head, position, recorded)
        return recorded
