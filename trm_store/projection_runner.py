"""Keeps a store's projections equal to a replay of its log: inline, on recovery, on demand.

Rebuilds go into scratch tables (committed batch by batch, so memory is bounded by a batch) and
are renamed into place with one transaction under the writer lock: readers see the old table or
the new one, never a half-built one. A rebuild that dies leaves the projection marked
`rebuilding`, and the next writable open rebuilds it again.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, MetaData, Table, delete, func, insert, select, text, update

from trm_store.driver import DriverSql, execute
from trm_store.errors import StoreError
from trm_store.events import RecordedEvent
from trm_store.log import events_after, head
from trm_store.projections import Projection
from trm_store.schema import PROJECTION_STATE

__all__ = ["ProjectionSet", "ProjectionStatus"]

REBUILD_SUFFIX = "__rebuild"
VERIFY_SUFFIX = "__verify"

WriteTransaction = Callable[[], AbstractContextManager[Connection]]
Progress = Callable[[int], None]
"""Called with the number of events just processed, once per batch."""


@dataclass(frozen=True, slots=True)
class ProjectionStatus:
    """A projection's bookkeeping row."""

    name: str
    version: int
    checkpoint: int
    status: str


def _now() -> datetime:
    return datetime.now(UTC)


class ProjectionSet:
    """The projections of one open store and their live tables."""

    def __init__(self, projections: Mapping[str, Projection]) -> None:
        self.projections = dict(projections)
        self.live: dict[str, dict[str, Table]] = {
            name: p.define(MetaData(), "") for name, p in self.projections.items()
        }
        # Built once and sent straight to the driver, with the projections' names and versions
        # rendered into the SQL: it runs in every append.
        current = " OR ".join(
            f"(name = :name_{i} AND version = :version_{i})" for i in range(len(self.projections))
        )
        literals: dict[str, str | int] = {}
        for i, (name, p) in enumerate(self.projections.items()):
            literals[f"name_{i}"] = name
            literals[f"version_{i}"] = p.version
        self._advance = DriverSql(
            "UPDATE projection_state SET checkpoint = :new_head "
            f"WHERE checkpoint = :previous_head AND ({current})",
            literals,
        )
        self._subscribers: dict[str, tuple[str, ...]] = {}
        """Event type -> the projections that take it, in registration order."""
        for name, p in self.projections.items():
            for event_type in p.event_types:
                self._subscribers[event_type] = (*self._subscribers.get(event_type, ()), name)

    # -- inline ---------------------------------------------------------------------------------

    def apply_inline(
        self, conn: Connection, previous_head: int, new_head: int, events: Sequence[RecordedEvent]
    ) -> None:
        """Advance every projection that was current at `previous_head` by `events`."""
        if not self.projections:
            return
        moved = execute(conn, self._advance, {"new_head": new_head, "previous_head": previous_head})
        if moved == len(self.projections):  # the common case: every projection was current
            advanced: Collection[str] = self.projections
        else:
            advanced = {
                name
                for name, status in self.statuses(conn).items()
                if status.checkpoint == new_head and name in self.projections
            }
        present = {e.type for e in events}
        if len(present) == 1:  # most appends: the subscribers are looked up, not searched for
            (only,) = present
            wanted: Collection[str] = self._subscribers.get(only, ())
        else:
            wanted = [
                n for n, p in self.projections.items() if not present.isdisjoint(p.event_types)
            ]
        for name in wanted:
            if name in advanced:
                projection = self.projections[name]
                projection.apply(
                    conn, self.live[name], _of_types(events, projection.event_types, present)
                )

    # -- state ----------------------------------------------------------------------------------

    def statuses(self, conn: Connection) -> dict[str, ProjectionStatus]:
        rows = conn.execute(select(PROJECTION_STATE)).all()
        return {r.name: ProjectionStatus(r.name, r.version, r.checkpoint, r.status) for r in rows}

    def stale(self, conn: Connection, names: Collection[str] | None = None) -> dict[str, str]:
        """Projections that cannot be read as they are, with the reason."""
        statuses = self.statuses(conn)
        last = head(conn)
        reasons: dict[str, str] = {}
        for name in names if names is not None else self.projections:
            projection = self.projections[name]
            status = statuses.get(name)
            if status is None:
                reasons[name] = "never built"
            elif status.version != projection.version:
                reasons[name] = f"built at version {status.version}, code is {projection.version}"
            elif status.checkpoint < last:
                reasons[name] = f"at position {status.checkpoint}, log head is {last}"
        return reasons

    def needing_rebuild(self, conn: Connection) -> list[str]:
        """Projections that cannot be caught up incrementally."""
        statuses = self.statuses(conn)
        return [
            name
            for name, p in self.projections.items()
            if (s := statuses.get(name)) is None or s.version != p.version or s.status != "ready"
        ]

    # -- recovery -------------------------------------------------------------------------------

    def catch_up(self, write: WriteTransaction, batch_size: int) -> dict[str, int]:
        """Apply the events each current projection has not seen yet; name -> events applied."""
        applied: dict[str, int] = {}
        with write() as conn:
            last = head(conn)
            statuses = self.statuses(conn)
            for name, projection in self.projections.items():
                status = statuses.get(name)
                if status is None or status.version != projection.version:
                    continue
                if status.checkpoint >= last:
                    continue
                applied[name] = _replay(
                    conn, projection, self.live[name], status.checkpoint, last, batch_size
                )
                _set_status(conn, name, projection.version, last, "ready")
        return applied

    def rebuild(
        self,
        write: WriteTransaction,
        names: Collection[str],
        batch_size: int,
        progress: Progress | None = None,
    ) -> dict[str, int]:
        """Rebuild `names` from the log in one pass, then swap them in; name -> events applied."""
        chosen = [self.projections[n] for n in names]
        if not chosen:
            return {}
        with write() as conn:
            for p in chosen:
                status = self.statuses(conn).get(p.name)
                if status is None:
                    _set_status(conn, p.name, 0, 0, "rebuilding")
                else:
                    conn.execute(
                        update(PROJECTION_STATE)
                        .where(PROJECTION_STATE.c.name == p.name)
                        .values(status="rebuilding", updated_at=_now())
                    )
        scratch = self._fill_scratch(write, chosen, REBUILD_SUFFIX, batch_size, progress)
        with write() as conn:
            last = head(conn)
            counts = self._finish_scratch(conn, chosen, scratch, last, batch_size)
            for p in chosen:
                for logical, table in p.define(MetaData(), "").items():
                    _swap(conn, scratch.tables[p.name][logical], table)
                _set_status(conn, p.name, p.version, last, "ready")
        return counts

    def verify(
        self, write: WriteTransaction, batch_size: int, progress: Progress | None = None
    ) -> list[str]:
        """Differences between the live tables and a rebuild from scratch (empty: consistent)."""
        chosen = list(self.projections.values())
        scratch = self._fill_scratch(write, chosen, VERIFY_SUFFIX, batch_size, progress)
        differences: list[str] = []
        with write() as conn:
            last = head(conn)
            self._finish_scratch(conn, chosen, scratch, last, batch_size)
            stale = self.stale(conn)
            for p in chosen:
                if p.name in stale:
                    differences.append(f"{p.name}: {stale[p.name]}")
                    continue
                for logical, live in self.live[p.name].items():
                    differences.extend(
                        _diff(conn, f"{p.name}.{logical}", live, scratch.tables[p.name][logical])
                    )
            for tables in scratch.tables.values():
                for table in tables.values():
                    table.drop(conn)
        return differences

    # -- helpers --------------------------------------------------------------------------------

    def _fill_scratch(
        self,
        write: WriteTransaction,
        chosen: Sequence[Projection],
        suffix: str,
        batch_size: int,
        progress: Progress | None,
    ) -> _Scratch:
        scratch = _Scratch({p.name: p.define(MetaData(), suffix) for p in chosen}, 0, {})
        with write() as conn:
            for tables in scratch.tables.values():
                for table in tables.values():
                    table.drop(conn, checkfirst=True)
                    table.create(conn)
        with _cyclic_gc_paused():
            while True:
                with write() as conn:
                    batch = events_after(conn, scratch.position, batch_size)
                    self._dispatch(conn, chosen, scratch, batch)
                if progress is not None and batch:
                    progress(len(batch))
                if len(batch) < batch_size:
                    return scratch

    def _finish_scratch(
        self,
        conn: Connection,
        chosen: Sequence[Projection],
        scratch: _Scratch,
        last: int,
        batch_size: int,
    ) -> dict[str, int]:
        """Bring scratch tables to `last` (events appended during the fill), under the lock."""
        while scratch.position < last:
            batch = events_after(conn, scratch.position, batch_size, until=last)
            if not batch:
                break
            self._dispatch(conn, chosen, scratch, batch)
        return dict(scratch.counts)

    @staticmethod
    def _dispatch(
        conn: Connection,
        chosen: Sequence[Projection],
        scratch: _Scratch,
        batch: Sequence[RecordedEvent],
    ) -> None:
        present = {e.type for e in batch}
        for p in chosen:
            mine = _of_types(batch, p.event_types, present)
            if mine:
                p.apply(conn, scratch.tables[p.name], mine)
            scratch.counts[p.name] = scratch.counts.get(p.name, 0) + len(mine)
        if batch:
            scratch.position = batch[-1].position


def _of_types(
    events: Sequence[RecordedEvent], types: frozenset[str], present: set[str]
) -> Sequence[RecordedEvent]:
    """The events of `types`, given the types `present` among them: no pass over the events
    when none or all of them are wanted (a rebuild is mostly the latter, for one projection)."""
    if present <= types:
        return events
    if present.isdisjoint(types):
        return ()
    return [e for e in events if e.type in types]


@dataclass(slots=True)
class _Scratch:
    tables: dict[str, dict[str, Table]]
    position: int
    counts: dict[str, int]


def _replay(
    conn: Connection,
    projection: Projection,
    tables: Mapping[str, Table],
    after: int,
    until: int,
    batch_size: int,
) -> int:
    """Apply the projection's events in (after, until] to `tables`; the number applied."""
    applied = 0
    while after < until:
        batch = events_after(conn, after, batch_size, types=projection.event_types, until=until)
        if not batch:
            break
        projection.apply(conn, tables, batch)
        applied += len(batch)
        after = batch[-1].position
    return applied


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, if it was on.

    A fill allocates millions of short-lived containers (decoded event data, rows to write), and
    each burst of allocations sets off collections that find no cycle, some of them walking every
    long-lived object of the process: measured at 20-25% of a rebuild. Those containers are freed
    by reference counting, so memory stays bounded by a batch; the few cycles made meanwhile are
    collected once the collector is back on. The switch is process-wide: a thread that finds it
    already off (another fill, or an application's choice) leaves it as it found it.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _swap(conn: Connection, scratch: Table, live: Table) -> None:
    """Make the filled `scratch` table the `live` one by renaming it: no row is copied.

    Index names are global and end with the suffix, so the scratch table's own indexes are
    dropped and the live ones built on the renamed table (SQLite has no ALTER INDEX ... RENAME).
    PostgreSQL names a table's primary key index and serial sequences after the table: those
    are renamed, or the next scratch table would get numbered names.
    """
    for index in scratch.indexes:
        index.drop(conn)
    live.drop(conn, checkfirst=True)
    quote = conn.dialect.identifier_preparer.quote
    conn.execute(text(f"ALTER TABLE {quote(scratch.name)} RENAME TO {quote(live.name)}"))
    for index in live.indexes:
        index.create(conn)
    if conn.dialect.name == "postgresql":
        named_after = conn.execute(
            _NAMED_AFTER_TABLE, {"table": quote(live.name), "prefix": scratch.name}
        )
        for relation, kind in named_after:
            renamed = live.name + relation.removeprefix(scratch.name)
            what = "INDEX" if kind == "i" else "SEQUENCE"
            conn.execute(text(f"ALTER {what} {quote(relation)} RENAME TO {quote(renamed)}"))


_NAMED_AFTER_TABLE = text(
    "SELECT c.relname, c.relkind FROM pg_class c"
    " WHERE starts_with(c.relname, :prefix) AND c.oid IN ("
    "  SELECT indexrelid FROM pg_index WHERE indrelid = CAST(:table AS regclass)"
    "  UNION SELECT objid FROM pg_depend"
    "  WHERE refobjid = CAST(:table AS regclass) AND classid = 'pg_class'::regclass)"
)
"""The indexes and owned sequences of a PostgreSQL table whose names start with `prefix`."""


def _set_status(conn: Connection, name: str, version: int, checkpoint: int, status: str) -> None:
    conn.execute(delete(PROJECTION_STATE).where(PROJECTION_STATE.c.name == name))
    conn.execute(
        insert(PROJECTION_STATE).values(
            name=name, version=version, checkpoint=checkpoint, status=status, updated_at=_now()
        )
    )


def _diff(conn: Connection, label: str, live: Table, rebuilt: Table) -> list[str]:
    columns = [c.name for c in live.c]
    if columns != [c.name for c in rebuilt.c]:
        return [f"{label}: live columns {columns} differ from the rebuild's"]
    live_rows = select(*[live.c[c] for c in columns])
    rebuilt_rows = select(*[rebuilt.c[c] for c in columns])
    found = []
    for what, query in (
        ("only in the live table", live_rows.except_(rebuilt_rows)),
        ("missing from the live table", rebuilt_rows.except_(live_rows)),
    ):
        count = conn.execute(select(func.count()).select_from(query.subquery())).scalar_one()
        if count:
            found.append(f"{label}: {count} row(s) {what}")
    return found


def require_known(projections: Mapping[str, Projection], names: Collection[str]) -> None:
    """Refuse names that are not registered projections."""
    unknown = sorted(set(names) - set(projections))
    if unknown:
        raise StoreError(f"unknown projection(s) {unknown}; known: {sorted(projections)}")
