"""The event store: append, read, and the projections kept equal to the log.

`open_store` is the one bootstrap: it builds the backend, verifies (or creates) the schema and, on a
writable open, brings every projection up to date.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Self

from sqlalchemy import Connection, Table
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from trm_store import domain
from trm_store.backend import INSERT_EVENTS, Backend, Durability, create_backend
from trm_store.driver import bind_processor, execute_many
from trm_store.errors import (
    ConcurrencyError,
    EventValidationError,
    StaleProjectionError,
    StoreError,
)
from trm_store.events import NewEvent, RecordedEvent, recorded_event
from trm_store.log import events_after, events_by_id, head, heads, stream_events, stream_head
from trm_store.migrate import ensure_schema
from trm_store.prepare import (
    AppendItem,
    AppendPreparer,
    PreparedAppend,
    PreparedEvent,
    check_items,
    prepared_append,
)
from trm_store.projection_runner import Progress, ProjectionSet, require_known
from trm_store.projections import Projection, registered_projections
from trm_store.schema import EVENTS

__all__ = ["AppendItem", "Store", "default_url", "open_store"]

DEFAULT_URL = "sqlite:///trm.db"

REPLAY_HINT = "run `trm replay-projections --db URL` (or open the store writable once)"


def default_url(url: str | None) -> str:
    """`url`, else TRM_STORE_URL, else ./trm.db."""
    return url or os.environ.get("TRM_STORE_URL") or DEFAULT_URL


class _EventIdTaken(Exception):
    """An event id of the append is in the log already; the transaction rolled back."""


class Store:
    """An open event store. Use `open_store` to get one; close it (or use `with`) when done."""

    def __init__(
        self, backend: Backend, projections: Mapping[str, Projection], *, batch_size: int = 1000
    ) -> None:
        self._backend = backend
        self._projections = ProjectionSet(projections)
        self._batch_size = batch_size
        self._prepare = AppendPreparer({"host": socket.gethostname(), "pid": os.getpid()})
        self._stored_time = bind_processor(EVENTS.c.recorded_at, backend.engine.dialect)

    # -- properties -----------------------------------------------------------------------------

    @property
    def read_only(self) -> bool:
        """True when opened with read_only=True: every write path raises ReadOnlyStoreError."""
        return self._backend.read_only

    @property
    def url(self) -> str:
        """Where the store lives (password hidden)."""
        return self._backend.describe()

    @property
    def dialect(self) -> str:
        """`sqlite` or `postgresql`."""
        return self._backend.engine.dialect.name

    @property
    def projection_names(self) -> list[str]:
        """The projections this store maintains."""
        return list(self._projections.projections)

    # -- writing --------------------------------------------------------------------------------

    def append(
        self, stream_id: str, events: Sequence[NewEvent], *, expected_version: int | None = None
    ) -> list[RecordedEvent]:
        """Append `events` to one stream in one transaction.

        expected_version: None = any version, 0 = the stream must not exist yet, n = the stream
        must be at version n; otherwise ConcurrencyError and nothing is written. Re-appending
        events whose event_ids are all recorded already returns the recorded events (a retried
        append is exactly-once).
        """
        return self._append([self._prepare((stream_id, events, expected_version))])

    def append_batch(self, items: Sequence[AppendItem]) -> list[RecordedEvent]:
        """Append to many streams in one transaction: all of it is written, or none."""
        return self._append([self._prepare(item) for item in check_items(items)])

    def prepare(self, event: NewEvent) -> PreparedEvent:
        """Validate one event now, exactly as `append` would, and fix its id.

        For writers that buffer events (`RunLog`): bad input is refused when it is recorded,
        not when a batch is written, and `append_prepared` does not validate it again.
        """
        return self._prepare.event(event)

    def append_prepared(
        self,
        stream_id: str,
        events: Sequence[PreparedEvent],
        *,
        expected_version: int | None = None,
    ) -> list[RecordedEvent]:
        """Append events made by `prepare` to one stream in one transaction, as `append` does.

        Their ids were fixed by `prepare`: appending the same events again (a retry after an
        error) returns the recorded events instead of writing them twice.
        """
        return self._append([prepared_append(stream_id, events, expected_version)])

    def _append(self, prepared: Sequence[PreparedAppend]) -> list[RecordedEvent]:
        try:
            with self._backend.append_transaction() as conn:
                return self._append_locked(conn, prepared)
        except SQLAlchemyError as e:
            raise self._translate(e) from e
        except (ConcurrencyError, _EventIdTaken) as e:
            # Optimistic idempotence: only a failed append pays for looking its ids up.
            recorded = self._already_recorded(prepared)
            if recorded is not None:
                return recorded
            if isinstance(e, ConcurrencyError):
                raise
            raise EventValidationError(
                "some of these event ids are recorded already: a retried append must resend "
                "exactly the same events"
            ) from None

    def _already_recorded(self, prepared: Sequence[PreparedAppend]) -> list[RecordedEvent] | None:
        """The recorded events if every caller-given id of this append is in the log, else None.

        Raises EventValidationError when only some of them are.
        """
        if not any(p.ids_given for p in prepared):
            return None
        ids = [e.event_id for p in prepared for e in p.events]
        with self._reading() as conn:
            found = events_by_id(conn, ids)
        if not found:
            return None
        if len(found) < len(ids):
            raise EventValidationError(
                f"{len(found)} of {len(ids)} event ids are recorded already: a retried append "
                "must resend exactly the same events"
            )
        return [found[eid] for eid in ids]

    @contextmanager
    def write_transaction(self) -> Iterator[Connection]:
        """A transaction holding the store's writer lock (for domain tables outside the log).

        Driver errors come out as typed StoreErrors, as from every other store method.
        """
        try:
            with self._backend.write_transaction() as conn:
                yield conn
        except SQLAlchemyError as e:
            raise self._translate(e) from e

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

    # -- reading --------------------------------------------------------------------------------

    def read_stream(self, stream_id: str, from_version: int = 1) -> list[RecordedEvent]:
        """The events of one stream, from `from_version` (1-based) on."""
        if not isinstance(stream_id, str) or not stream_id:
            raise EventValidationError("stream_id must be a non-empty string")
        if isinstance(from_version, bool) or not isinstance(from_version, int) or from_version < 1:
            raise EventValidationError(f"from_version must be an int >= 1, got {from_version!r}")
        with self._reading() as conn:
            return stream_events(conn, stream_id, from_version)

    def read_all(self, after_position: int = 0, batch_size: int = 1000) -> Iterator[RecordedEvent]:
        """Every event after `after_position` in global order, fetched `batch_size` at a time."""
        if (
            isinstance(after_position, bool)
            or not isinstance(after_position, int)
            or after_position < 0
        ):
            raise EventValidationError(
                f"after_position must be an int >= 0, got {after_position!r}"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise EventValidationError(f"batch_size must be an int >= 1, got {batch_size!r}")
        return self._read_all(after_position, batch_size)

    def _read_all(self, after: int, batch_size: int) -> Iterator[RecordedEvent]:
        while True:
            with self._reading() as conn:
                batch = events_after(conn, after, batch_size)
            yield from batch
            if len(batch) < batch_size:
                return
            after = batch[-1].position

    def head_position(self) -> int:
        """The position of the last committed event (0 for an empty log)."""
        with self._reading() as conn:
            return head(conn)

    @contextmanager
    def query(self, projection: str) -> Iterator[tuple[Connection, Mapping[str, Table]]]:
        """A read transaction on an up-to-date projection: (connection, its tables by name).

        A writable store catches a stale projection up first; a read-only one raises
        StaleProjectionError instead of writing.
        """
        require_known(self._projections.projections, [projection])
        tables = self._projections.live[projection]
        lock = list(tables.values())
        with self._reading(lock) as conn:
            stale = self._projections.stale(conn, [projection])
            if not stale:
                yield conn, tables
                return
        if self.read_only:
            raise StaleProjectionError(
                f"projection {projection!r} is stale ({stale[projection]}); {REPLAY_HINT}"
            )
        self.recover()
        with self._reading(lock) as conn:
            yield conn, tables

    @contextmanager
    def _reading(self, lock: Sequence[Table] = ()) -> Iterator[Connection]:
        try:
            with self._backend.read_transaction(lock) as conn:
                yield conn
        except SQLAlchemyError as e:
            raise self._translate(e) from e

    # -- projections ----------------------------------------------------------------------------

    def recover(self) -> dict[str, int]:
        """Rebuild projections whose version changed or whose rebuild was interrupted, then catch
        up the ones behind the log. Returns name -> events applied."""
        with self._reading() as conn:
            to_rebuild = self._projections.needing_rebuild(conn)
        applied = self._projections.rebuild(self.write_transaction, to_rebuild, self._batch_size)
        applied.update(self._projections.catch_up(self.write_transaction, self._batch_size))
        return applied

    def rebuild_projections(
        self, only: str | Collection[str] | None = None, *, progress: Progress | None = None
    ) -> dict[str, int]:
        """Rebuild projections (all, or `only` this name / these names) from the log.

        Returns name -> events applied.
        """
        if only is None:
            names = list(self._projections.projections)
        else:
            names = [only] if isinstance(only, str) else list(only)
        require_known(self._projections.projections, names)
        try:
            return self._projections.rebuild(
                self.write_transaction, names, self._batch_size, progress
            )
        except SQLAlchemyError as e:
            raise self._translate(e) from e

    def verify_projections(self, *, progress: Progress | None = None) -> list[str]:
        """Rebuild every projection into scratch tables and diff them against the live ones."""
        try:
            return self._projections.verify(self.write_transaction, self._batch_size, progress)
        except SQLAlchemyError as e:
            raise self._translate(e) from e

    # -- lifecycle ------------------------------------------------------------------------------

    def _translate(self, error: SQLAlchemyError) -> StoreError:
        typed = self._backend.translate(error)
        if typed is not None:
            return typed
        detail = error.orig if isinstance(error, DBAPIError) else error
        return StoreError(f"database error on {self.url}: {detail}")

    def close(self) -> None:
        """Release every connection."""
        self._backend.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_store(
    url: str | None = None,
    *,
    read_only: bool = False,
    auto_upgrade: bool = False,
    durability: Durability = "normal",
    projections: Mapping[str, Projection] | None = None,
) -> Store:
    """Open (creating at the head migration if new) the store at `url`.

    url defaults to TRM_STORE_URL, then sqlite:///trm.db. A database at an older migration raises
    SchemaVersionError naming `alembic upgrade head` unless auto_upgrade=True. read_only=True never
    writes (SQLite `mode=ro`, PostgreSQL read-only transactions). `projections` defaults to every
    registered projection (trm's domain read models and any the caller registered).
    """
    domain.load()
    backend = create_backend(default_url(url), read_only=read_only, durability=durability)
    store = Store(backend, registered_projections() if projections is None else projections)
    try:
        if read_only:
            with backend.read_transaction() as conn:
                ensure_schema(conn, auto_upgrade=False, writable=False)
        else:
            with backend.write_transaction() as conn:
                ensure_schema(conn, auto_upgrade=auto_upgrade, writable=True)
            store.recover()
    except SQLAlchemyError as e:
        store.close()
        raise store._translate(e) from e
    except BaseException:
        store.close()
        raise
    return store
