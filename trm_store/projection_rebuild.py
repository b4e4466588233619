"""Rebuilding projections from the log into scratch tables, swapping them in, and verifying.

Rebuilds go into scratch tables (committed batch by batch, so memory is bounded by a batch) and
are renamed into place with one transaction under the writer lock: readers see the old table or
the new one, never a half-built one. A rebuild runs only while its caller holds the store's
rebuild lock (`trm_store.rebuild_lock`), so the scratch tables, whose names are fixed, have one
writer; the swap checks the lock is still held. A rebuild that dies leaves the projection marked
`rebuilding`, and the next writable open that gets the lock rebuilds it again.

A verify needs no lock: it fills TEMP tables on a connection of its own, which nobody else sees
and which vanish with the connection (a killed verify leaves nothing behind), and it compares
them with the live tables in one read snapshot.
"""

from __future__ import annotations

import gc
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

from sqlalchemy import Connection, MetaData, Table, func, select, text

from trm_store.backend import Backend
from trm_store.errors import ReadOnlyStoreError
from trm_store.events import RecordedEvent
from trm_store.log import events_after, head
from trm_store.projection_runner import Progress, ProjectionSet, WriteTransaction
from trm_store.projection_state import mark_rebuilding, of_types, set_status
from trm_store.projections import Projection
from trm_store.rebuild_lock import RebuildLock

__all__ = ["paused_cyclic_gc", "rebuild", "verify"]

REBUILD_SUFFIX = "__rebuild"
VERIFY_SUFFIX = "__verify"
_TEMP_SCHEMA = {"sqlite": "temp", "postgresql": "pg_temp"}
"""Where each database creates a table that only its connection sees and that dies with it."""


def rebuild(
    projections: ProjectionSet,
    write: WriteTransaction,
    owner: RebuildLock,
    names: Collection[str],
    batch_size: int,
    progress: Progress | None = None,
) -> dict[str, int]:
    """Rebuild `names` from the log in one pass, then swap them in; name -> events applied.

    The caller holds the rebuild lock `owner` throughout.
    """
    chosen = [projections.projections[n] for n in names]
    if not chosen:
        return {}
    scratch = {p.name: p.define(MetaData(), REBUILD_SUFFIX) for p in chosen}
    with write() as conn:
        for p in chosen:
            mark_rebuilding(conn, p.name)
        _create(conn, scratch, replace=True)  # what a killed owner left is dropped
    filled = _fill_scratch(write, chosen, scratch, batch_size, progress)
    with write() as conn:
        owner.confirm(conn)
        last = head(conn)
        counts = _finish_scratch(conn, chosen, filled, last, batch_size)
        for p in chosen:
            for logical, table in p.define(MetaData(), "").items():
                _swap(conn, scratch[p.name][logical], table)
            set_status(conn, p.name, p.version, last, "ready")
    return counts


def verify(
    projections: ProjectionSet,
    backend: Backend,
    batch_size: int,
    progress: Progress | None = None,
) -> list[str]:
    """Differences between the live tables and a rebuild from scratch (empty: consistent).

    It writes only TEMP tables, in read transactions: no writer waits for it, and its final
    comparison reads the log, `projection_state` and the live tables in one snapshot.
    """
    if backend.read_only:
        raise ReadOnlyStoreError(f"store {backend.describe()} was opened read_only=True")
    chosen = list(projections.projections.values())
    live = [t for p in chosen for t in projections.live[p.name].values()]
    with _private_connection(backend) as private:

        def read(lock: Sequence[Table] = ()) -> AbstractContextManager[Connection]:
            return backend.read_transaction(lock, private)

        temp = _TEMP_SCHEMA[private.dialect.name]
        scratch = {p.name: _moved(p.define(MetaData(), VERIFY_SUFFIX), temp) for p in chosen}
        with read() as conn:
            _create(conn, scratch, replace=False)
        filled = _fill_scratch(read, chosen, scratch, batch_size, progress)
        differences: list[str] = []
        with read(live) as conn:
            last = head(conn)
            _finish_scratch(conn, chosen, filled, last, batch_size)
            stale = projections.stale(conn)
            for p in chosen:
                if p.name in stale:
                    differences.append(f"{p.name}: {stale[p.name]}")
                    continue
                for logical, table in projections.live[p.name].items():
                    differences.extend(
                        _diff(conn, f"{p.name}.{logical}", table, scratch[p.name][logical])
                    )
    return differences


@contextmanager
def _private_connection(backend: Backend) -> Iterator[Connection]:
    """A connection nobody else uses, closed (never pooled) at the end: its TEMP tables die."""
    conn = backend.engine.connect()
    try:
        yield conn
    finally:
        conn.invalidate()
        conn.close()


def _moved(tables: Mapping[str, Table], schema: str) -> dict[str, Table]:
    """Copies of one projection's `tables` (indexes included) in `schema`, whatever MetaData
    its `define` put them in."""
    metadata = MetaData()
    return {logical: t.to_metadata(metadata, schema=schema) for logical, t in tables.items()}


def _create(conn: Connection, scratch: Mapping[str, Mapping[str, Table]], *, replace: bool) -> None:
    for tables in scratch.values():
        for table in tables.values():
            if replace:
                table.drop(conn, checkfirst=True)
            table.create(conn)


@contextmanager
def paused_cyclic_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, if it was on: `trm replay-projections`
    runs its rebuild or verification in it (never `open_store` or a library call: the switch is
    process-wide, an application's to make).

    A fill allocates millions of short-lived containers (decoded event data, rows to write), and
    each burst of allocations sets off collections that find no cycle, some of them walking every
    long-lived object of the process: measured at 20-25% of a rebuild. Those containers are freed
    by reference counting, so memory stays bounded by a batch; the few cycles made meanwhile are
    collected once the collector is back on. A block that finds it already off leaves it off.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass(slots=True)
class _Scratch:
    tables: Mapping[str, Mapping[str, Table]]
    position: int
    counts: dict[str, int]


def _fill_scratch(
    write: WriteTransaction,
    chosen: Sequence[Projection],
    tables: Mapping[str, Mapping[str, Table]],
    batch_size: int,
    progress: Progress | None,
) -> _Scratch:
    scratch = _Scratch(tables, 0, {})
    while True:
        with write() as conn:
            batch = events_after(conn, scratch.position, batch_size)
            _dispatch(conn, chosen, scratch, batch)
        if progress is not None and batch:
            progress(len(batch))
        if len(batch) < batch_size:
            return scratch


def _finish_scratch(
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
        _dispatch(conn, chosen, scratch, batch)
    return dict(scratch.counts)


def _dispatch(
    conn: Connection,
    chosen: Sequence[Projection],
    scratch: _Scratch,
    batch: Sequence[RecordedEvent],
) -> None:
    present = {e.type for e in batch}
    for p in chosen:
        mine = of_types(batch, p.event_types, present)
        if mine:
            p.apply(conn, scratch.tables[p.name], mine)
        scratch.counts[p.name] = scratch.counts.get(p.name, 0) + len(mine)
    if batch:
        scratch.position = batch[-1].position


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
