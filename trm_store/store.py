"""The event store's facade, `Store`: append, read, query projections, rebuild and verify them.

Every method checks its arguments and hands the work to the module whose job it is: validation
(`prepare`), the append (`append`), log reads (`log`), projections (`projection_runner`,
`projection_rebuild`). `trm_store.bootstrap.open_store` builds one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from typing import Self
from weakref import WeakSet

from sqlalchemy import Connection, Table
from sqlalchemy.exc import SQLAlchemyError

from trm_store.append import Appender
from trm_store.append_args import AppendItem, check_items
from trm_store.backend import Backend, reading, rolled_back, store_error, writing
from trm_store.errors import StaleProjectionError
from trm_store.events import NewEvent, RecordedEvent
from trm_store.log import head, read_batches, stream_events, stream_head
from trm_store.prepare import AppendPreparer, origin, prepared_append
from trm_store.prepared import PreparedEvent, seal
from trm_store.projection_rebuild import rebuild, verify
from trm_store.projection_runner import Progress, ProjectionSet, requested, require_known
from trm_store.projection_state import ProjectionStatus, statuses
from trm_store.projections import Projection
from trm_store.read_args import (
    checked_count,
    checked_filter,
    checked_stream_id,
    checked_stream_read,
)
from trm_store.subscription import Subscription

__all__ = ["AppendItem", "Store"]

REPLAY_HINT = "run `trm replay-projections --db URL` (or open the store writable once)"


class Store:
    """An open event store. Use `open_store` to get one; close it (or use `with`) when done."""

    def __init__(
        self, backend: Backend, projections: Mapping[str, Projection], *, batch_size: int = 1000
    ) -> None:
        self._backend = backend
        self._projections = ProjectionSet(projections)
        self._batch_size = batch_size
        self._prepare = AppendPreparer(origin())
        self._appends = Appender(backend, self._projections).queue
        self._append = self._appends.append
        self._subscriptions: WeakSet[Subscription] = WeakSet()

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
        the very same events (their ids recorded, each with the same stream, type, data and
        meta) returns the recorded events: a retried append is exactly-once. Any other use of a
        recorded id raises EventIdConflictError (`trm_store.event_reuse`)."""
        return self._append([self._prepare((stream_id, events, expected_version))])

    def append_batch(self, items: Sequence[AppendItem]) -> list[RecordedEvent]:
        """Append to many streams in one transaction: all of it is written, or none."""
        return self._append([self._prepare(item) for item in check_items(items)])

    def prepare(self, event: NewEvent) -> PreparedEvent:
        """Validate one event now, exactly as `append` would, and fix its id: for writers that
        buffer events (`RunLog`), bad input is refused when it is recorded, not when a batch is
        written, and `append_prepared` does not validate it again (unless it changed)."""
        return seal(self._prepare.event(event))

    def append_prepared(
        self,
        stream_id: str,
        events: Sequence[PreparedEvent],
        *,
        expected_version: int | None = None,
    ) -> list[RecordedEvent]:
        """Append events made by `prepare` to one stream in one transaction, as `append` does.

        Their ids were fixed by `prepare`: appending the same events again (a retry after an
        error) returns the recorded events instead of writing them twice; to another stream,
        EventIdConflictError."""
        return self._append([prepared_append(stream_id, events, expected_version)])

    def _append_unexposed(
        self, stream_id: str, events: list[PreparedEvent], expected_version: int
    ) -> list[RecordedEvent]:
        """`append_prepared` for trm_store's own buffering writers (`RunLog`): their events were
        made by `prepare` and held by no other code since, so each is not checked again."""
        return self._append([prepared_append(stream_id, events, expected_version, exposed=False)])

    def write_transaction(self) -> AbstractContextManager[Connection]:
        """A transaction holding the store's writer lock (for domain tables outside the log);
        driver errors come out as typed StoreErrors, as from every other store method."""
        return self._appends.holding_writer(writing(self._backend))

    # -- reading --------------------------------------------------------------------------------

    def read_stream(
        self,
        stream_id: str,
        from_version: int | None = None,
        *,
        backwards: bool = False,
        limit: int | None = None,
    ) -> list[RecordedEvent]:
        """Up to `limit` events of one stream, in version order from `from_version` on.

        `from_version` is the first version returned in the reading direction: forwards the
        lowest (None: 1), `backwards=True` the highest (None: the stream's newest), newest
        first. `read_stream(s, backwards=True, limit=1)` is the newest event, one index row.
        """
        stream_id = checked_stream_id(stream_id)
        version, rows = checked_stream_read(from_version, backwards, limit)
        with self._reading(one_statement=True) as conn:
            return stream_events(conn, stream_id, version, backwards=backwards, limit=rows)

    def stream_version(self, stream_id: str) -> int:
        """The stream's current version: its number of events (0: no such stream)."""
        stream_id = checked_stream_id(stream_id)
        with self._reading(one_statement=True) as conn:
            return stream_head(conn, stream_id)

    def read_all(
        self,
        after_position: int = 0,
        batch_size: int = 1000,
        *,
        types: Collection[str] | None = None,
        stream_prefix: str | None = None,
    ) -> Iterator[RecordedEvent]:
        """Every event after `after_position` in global order, fetched `batch_size` at a time.

        `types`: only events of these types; `stream_prefix`: only events of streams whose id
        starts with it (a plain prefix: `%` and `_` are characters like any other). Only the
        matching events are read, through an index.
        """
        after = checked_count("after_position", after_position, 0)
        size = checked_count("batch_size", batch_size, 1)
        wanted = checked_filter(types, stream_prefix)  # unfiltered: one statement a batch
        reads = partial(self._reading, one_statement=wanted is None)
        return read_batches(reads, wanted, after, size)

    def subscribe(
        self,
        after_position: int = 0,
        *,
        types: Collection[str] | None = None,
        stream_prefix: str | None = None,
    ) -> Subscription:
        """Every matching event after `after_position`: first those in the log, then each as it
        is committed, in position order, none skipped or repeated (see `Subscription`)."""
        after = checked_count("after_position", after_position, 0)
        wanted, on_error = checked_filter(types, stream_prefix), partial(store_error, self._backend)
        subscription = Subscription(self._backend.engine, after, wanted, self._batch_size, on_error)
        self._subscriptions.add(subscription)
        return subscription

    def head_position(self) -> int:
        """The position of the last committed event (0 for an empty log)."""
        with self._reading(one_statement=True) as conn:
            return head(conn)

    def projection_status(self) -> dict[str, ProjectionStatus]:
        """Each projection's version, checkpoint (against `head_position()`) and status, by
        name. Never catches anything up, so it works on a stale read-only store."""
        with self._reading() as conn:
            return statuses(conn)

    @contextmanager
    def query(self, projection: str) -> Iterator[tuple[Connection, Mapping[str, Table]]]:
        """A read transaction on an up-to-date projection: (connection, its tables by name).

        A writable store catches a stale projection up first; a read-only one raises
        StaleProjectionError instead of writing. Rolled back at the end: a session setting the
        caller's SQL made (a `search_path`) ends with it, never reaching the store's reads.
        """
        require_known(self._projections.projections, [projection])
        tables = self._projections.live[projection]
        lock = list(tables.values())
        with self._reading(lock) as conn:
            stale = self._projections.stale(conn, [projection])
            if not stale:
                yield from rolled_back(conn, tables)
                return
        if self.read_only:
            raise StaleProjectionError(
                f"projection {projection!r} is stale ({stale[projection]}); {REPLAY_HINT}"
            )
        self.recover()
        with self._reading(lock) as conn:
            yield from rolled_back(conn, tables)

    def _reading(
        self, lock: Sequence[Table] = (), *, one_statement: bool = False
    ) -> AbstractContextManager[Connection]:
        return reading(self._backend, lock, one_statement=one_statement)

    # -- projections ----------------------------------------------------------------------------

    def recover(self) -> dict[str, int]:
        """Rebuild projections whose version changed or whose rebuild was interrupted, then catch
        up the ones behind the log. Returns name -> events applied.

        A rebuild another live process owns is left to it: its projections are served as they
        are (their live tables, which appends keep current) when their version is this code's,
        else this call waits for it to end. What is still needed is then rebuilt here.
        """
        with self._reading() as conn:
            wanted = self._projections.needing_rebuild(conn)
            unbuilt = self._projections.unbuilt(conn)
        rebuilt = self._rebuild(None, wait=False) if wanted else {}
        if rebuilt is None and set(wanted) & set(unbuilt):  # a live owner has what cannot be
            rebuilt = self._rebuild(None, wait=True)  # served: wait for it, then finish
        applied = dict(rebuilt or {})
        applied.update(self._projections.catch_up(self.write_transaction, self._batch_size))
        return applied

    def rebuild_projections(
        self, only: str | Collection[str] | None = None, *, progress: Progress | None = None
    ) -> dict[str, int]:
        """Rebuild projections (all, or `only` this name / these names) from the log.

        Waits for a rebuild another process owns to end first. Returns name -> events applied.
        """
        names = requested(self._projections.projections, only)
        applied = self._rebuild(names, wait=True, progress=progress)
        assert applied is not None, "a lock waited for is held"
        return applied

    def _rebuild(
        self, names: Collection[str] | None, *, wait: bool, progress: Progress | None = None
    ) -> dict[str, int] | None:
        """Rebuild `names` (None: those that need it, as found under the lock) holding the
        rebuild lock; None when `wait` is False and another live process holds it."""
        try:
            with self._backend.rebuild_lock(wait=wait) as owner:
                if owner is None:
                    return None
                if names is None:
                    with self._reading() as conn:
                        names = self._projections.needing_rebuild(conn)
                write, size = self.write_transaction, self._batch_size
                return rebuild(self._projections, write, owner, names, size, progress)
        except SQLAlchemyError as e:
            raise store_error(self._backend, e) from e

    def verify_projections(self, *, progress: Progress | None = None) -> list[str]:
        """Rebuild every projection into scratch tables and diff them against the live ones."""
        try:
            return verify(self._projections, self._backend, self._batch_size, progress)
        except SQLAlchemyError as e:
            raise store_error(self._backend, e) from e

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Release every connection, the open subscriptions' too."""
        for subscription in list(self._subscriptions):
            subscription.close()
        self._backend.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
