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
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError, SQLAlchemyError

from trm_store.append_heads import AppendHeads
from trm_store.append_queue import AppendQueue, QueuedAppend
from trm_store.backend import AppendServerNumbered, Backend, reading, store_error
from trm_store.driver import bind_processor
from trm_store.errors import ConcurrencyError, EventValidationError, StoreError
from trm_store.event_reuse import duplicate_id, event_ids, retried
from trm_store.events import RecordedEvent
from trm_store.handler_raised import raised_by_a_handler
from trm_store.log import events_by_id, stream_heads
from trm_store.prepared import PreparedAppend
from trm_store.projection_runner import ProjectionSet
from trm_store.rows_insert import RowsInsert, insert_rows
from trm_store.schema import EVENT_COLUMNS, EVENTS
from trm_store.written import Written

__all__ = ["INSERT_EVENTS", "Appender"]

INSERT_EVENTS = RowsInsert("events", EVENT_COLUMNS)
"""The event rows of an append, their values one after another in `EVENT_COLUMNS` order
(`trm_store.rows_insert`): JSON already serialised, `recorded_at` through its column type's
`bind_processor`."""
_ROW_WIDTH = len(INSERT_EVENTS.columns)


def _rows(item: PreparedAppend, position: int, version: int, stored_now: Any) -> list[Any]:
    """`item`'s rows' values one after another, in column order, numbered on from `position`
    and `version` (the last ones written before it); one event (most appends) without a loop
    to set up, which cost it ~3,300 instructions."""
    stream_id = item.stream_id
    if len(item.event_ids) == 1:
        return [
            position + 1,
            item.event_ids[0],
            stream_id,
            version + 1,
            item.types[0],
            item.schema_versions[0],
            item.data_jsons[0],
            item.meta_jsons[0],
            stored_now,
        ]
    rows: list[Any] = []
    for event_id, type_, sv, data, meta in zip(
        item.event_ids,
        item.types,
        item.schema_versions,
        item.data_jsons,
        item.meta_jsons,
        strict=True,
    ):
        position += 1
        version += 1
        rows += (position, event_id, stream_id, version, type_, sv, data, meta, stored_now)
    return rows


def _everyones(error: StoreError) -> bool:
    """A failure of the transaction itself, not of one append's rows: the writer lock or the
    busy timeout (raised by the store, no cause), the connection, the disk or the COMMIT (the
    driver's OperationalError / InterfaceError), or the sync after it (an OSError,
    `trm_store.wal_sync`), which no append written again alone could undo."""
    cause = error.__cause__
    return cause is None or isinstance(cause, OperationalError | InterfaceError | OSError)


class _EventIdTaken(Exception):
    """An event id of the append is in the log already, or twice in the append: the unique
    index refused the insert and the transaction rolled back."""

    def __init__(self, error: IntegrityError) -> None:
        super().__init__(str(error))
        self.error = error


class Appender:
    """Appends validated events to one store's log, through its `queue`: each append atomic
    (all of it, or nothing), concurrent ones written together (`trm_store.append_queue`).

    A retry of an append that was recorded returns the recorded events; any other use of a
    recorded id raises EventIdConflictError (`trm_store.event_reuse`).
    """

    def __init__(self, backend: Backend, projections: ProjectionSet) -> None:
        self._backend = backend
        self._projections = projections
        self._stored_time = bind_processor(EVENTS.c.recorded_at, backend.engine.dialect)
        self.queue = AppendQueue(self.write_group, self._write_alone)

    def write_group(self, group: list[QueuedAppend]) -> None:
        """Decide every append of `group`: in one transaction when there are several, each
        refused alone by a stream not at its expected version.

        What a signal handler raised (`trm_store.handler_raised`) is this thread's interrupt:
        it passes through, and the queue sends the group's undecided appends again. A
        database error (the lock held past the busy timeout, a lost connection, a COMMIT
        whose outcome is unknown) is every append's: each caller gets it, as from an append
        of its own, at once. A failure one append may have caused (an event id taken, a
        projection's error), and an append that may be a retry, send the appends concerned
        through one by one, each to its own outcome. After a failure of the group's
        transaction, each append may have been written all the same (an exception raised by a
        signal handler once the `COMMIT` had left): one then refused by a moved stream is first
        looked up in the log, and returned if it is there.
        """
        alone = group
        maybe_written = False
        if len(group) > 1:
            try:
                outcomes = self._write([queued.prepared for queued in group])
            except Exception as e:
                if raised_by_a_handler(e):  # an interrupt: the queue retries the group's others
                    raise
                if isinstance(e, StoreError) and _everyones(e):
                    for queued in group:
                        queued.error = e
                    return
                outcomes = None
                maybe_written = True
            if outcomes is not None:
                alone = []
                for queued, outcome in zip(group, outcomes, strict=True):
                    if not isinstance(outcome, ConcurrencyError):
                        queued.written = outcome
                    elif any(item.ids_given for item in queued.prepared):
                        alone.append(queued)  # perhaps recorded already: `_write_alone` tells
                    else:
                        queued.error = outcome
        for queued in alone:
            if queued.abandoned:  # its caller was interrupted, and told so: never written after
                continue
            try:
                queued.written = self._write_alone(queued.prepared, maybe_written=maybe_written)
            except Exception as e:
                if raised_by_a_handler(e):  # this thread's interrupt, not `queued`'s error
                    raise
                queued.error = e

    def _write_alone(
        self, prepared: Sequence[PreparedAppend], *, maybe_written: bool = False
    ) -> Written:
        """`prepared` in a transaction of its own, statement by statement when it `maybe_written`
        (its event ids then found taken by a bound parameter, not in a query that carries every
        value of the append, which PostgreSQL would log whole)."""
        try:
            (outcome,) = self._write([prepared], server_numbered=not maybe_written)
            if isinstance(outcome, ConcurrencyError):
                raise outcome
            return outcome
        except ConcurrencyError:
            # A stream moved: a retry of a recorded append, when the caller chose its ids, or
            # when a failed group's transaction may have written it.
            if not (maybe_written or any(p.ids_given for p in prepared)):
                raise
            recorded = self._retried(prepared)
            if recorded is None:
                raise
            return Written.found(recorded)
        except _EventIdTaken as e:
            recorded = self._retried(prepared)
            if recorded is None:  # not reached: the log only grows, so the taken id is there
                raise store_error(self._backend, e.error) from e.error
            return Written.found(recorded)

    def _write(
        self, appends: Sequence[Sequence[PreparedAppend]], *, server_numbered: bool = True
    ) -> list[Written | ConcurrencyError]:
        """`appends` in one transaction; each one as written, or the ConcurrencyError that
        refused it (and wrote none of it). Numbered by the database when it can, and
        `server_numbered`."""
        try:
            write = self._backend.append_server_numbered
            if server_numbered and write is not None:
                written = self._server_numbered(write, appends)
                if written is not None:
                    return written
            stream_id = appends[0][0].stream_id
            return self._backend.append_transaction(
                stream_id, self._projections.known_epoch, self._write_locked, appends
            )
        except SQLAlchemyError as e:
            raise store_error(self._backend, e) from e

    def _server_numbered(
        self, write: AppendServerNumbered, appends: Sequence[Sequence[PreparedAppend]]
    ) -> list[Written | ConcurrencyError] | None:
        """`appends` numbered and inserted by the database (`write`, the backend's
        `append_server_numbered`), when no projection of this store takes their events (those are
        applied in the append's transaction, in Python) and no caller chose their ids (a retry
        is refused by the unique index: an error, which PostgreSQL logs with the query that
        holds every value); None when they were not written so. Whatever it leaves (a stream
        moved, an event id taken) the caller writes statement by statement, which tells each
        append's outcome."""
        if any(item.ids_given for prepared in appends for item in prepared) or self._taken(appends):
            return None
        now = datetime.now(UTC)
        numbered = write(appends, now, self._projections.versions)
        if numbered is None:
            return None
        outcomes: list[Written | ConcurrencyError] = []
        first = 0  # each item's first event's position and version; its others follow them
        for prepared in appends:
            starts = []
            for item in prepared:
                starts.append(numbered[first])
                first += len(item.event_ids)
            outcomes.append(Written(prepared, starts, now))
        return outcomes

    def _taken(self, appends: Sequence[Sequence[PreparedAppend]]) -> bool:
        """Whether a projection of this store takes any event of `appends`."""
        return self._projections.take_any(
            {t for prepared in appends for item in prepared for t in item.types}
        )

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

    def _write_locked(
        self,
        conn: Connection,
        read: AppendHeads,
        appends: Sequence[Sequence[PreparedAppend]],
    ) -> list[Written | ConcurrencyError]:
        """The group's rows under the lock, from what the backend `read` under it. The
        recorded events are built here only for the projections that take them; the others
        are their callers' to build (`trm_store.written`)."""
        previous_head = read.log_head
        first_stream = appends[0][0].stream_id
        versions = {first_stream: read.stream_version}
        if len(appends) > 1 or len(appends[0]) > 1:  # else (most appends) no other stream
            named = dict.fromkeys(item.stream_id for a in appends for item in a)
            others = [stream_id for stream_id in named if stream_id != first_stream]
            if others:
                versions.update(stream_heads(conn, others))
        position = previous_head
        now = datetime.now(UTC)
        stored_now = now if self._stored_time is None else self._stored_time(now)
        rows: list[Any] = []  # the rows' values one after another, in column order
        outcomes: list[Written | ConcurrencyError] = []
        for prepared in appends:
            first = len(rows)
            moved: dict[str, int] = {}
            starts: list[tuple[int, int]] = []
            try:
                for item in prepared:
                    stream_id = item.stream_id
                    current = moved.get(stream_id, versions[stream_id])
                    if item.expected_version is not None and item.expected_version != current:
                        raise ConcurrencyError(stream_id, item.expected_version, current)
                    starts.append((position + 1, current + 1))
                    count = len(item.event_ids)
                    rows += _rows(item, position, current, stored_now)
                    position += count
                    current += count
                    moved[stream_id] = current
            except ConcurrencyError as refused:  # this append writes nothing; the others go on
                del rows[first:]
                position = previous_head + len(rows) // _ROW_WIDTH
                outcomes.append(refused)
                continue
            versions.update(moved)
            outcomes.append(Written(prepared, starts, now))
        if rows:
            following = self._projections.follow(conn, read)
            try:
                insert_rows(conn, INSERT_EVENTS, rows)
            except IntegrityError as e:
                if "event_id" in str(e.orig):
                    raise _EventIdTaken(e) from e
                raise
            if following and self._taken(appends):
                events = [e for w in outcomes if isinstance(w, Written) for e in w.events()]
                self._projections.apply_inline(conn, events, following)
        return outcomes
