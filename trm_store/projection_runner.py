"""Keeps a store's projections current: applied inline in each append, caught up on recovery.

A projection can be caught up incrementally while it is `ready` at the code's version; otherwise
it needs a rebuild from the log (`trm_store.projection_rebuild`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager

from sqlalchemy import Connection, MetaData, Table

from trm_store.append_heads import NO_EPOCH, AppendHeads
from trm_store.driver import DriverSql, execute_many
from trm_store.errors import StoreError
from trm_store.events import RecordedEvent
from trm_store.log import events_after, head
from trm_store.projection_state import (
    FOLLOWING,
    ProjectionStatus,
    of_types,
    set_status,
    statuses,
)
from trm_store.projections import Projection

__all__ = ["Progress", "ProjectionSet", "WriteTransaction", "requested", "require_known"]

WriteTransaction = Callable[[], AbstractContextManager[Connection]]
Progress = Callable[[int], None]
"""Called with the number of events just processed, once per batch."""
_SET_CHECKPOINT = DriverSql(
    "UPDATE projection_state SET checkpoint = :checkpoint WHERE name = :name"
)


class ProjectionSet:
    """The projections of one open store and their live tables."""

    def __init__(self, projections: Mapping[str, Projection]) -> None:
        self.projections = dict(projections)
        self.live: dict[str, dict[str, Table]] = {
            name: p.define(MetaData(), "") for name, p in self.projections.items()
        }
        self.versions = {name: p.version for name, p in self.projections.items()}
        """Name -> version: the projections this code runs."""
        self._known: tuple[int, frozenset[str]] = (NO_EPOCH, frozenset())
        """The projections' epoch when `follow` last decided who follows without changing a
        row, and its answer: one attribute, so that an interrupt cannot leave one of them
        new beside the other old."""
        self._subscribers: dict[str, tuple[str, ...]] = {}
        """Event type -> the projections that take it, in registration order."""
        for name, p in self.projections.items():
            for event_type in p.event_types:
                self._subscribers[event_type] = (*self._subscribers.get(event_type, ()), name)

    def follow(self, conn: Connection, read: AppendHeads) -> Collection[str]:
        """The projections that apply an append inline, from what it read under the writer
        lock (`trm_store.append_heads`): those `follow` last decided while the projections'
        epoch is the one it decided at (most appends: no row was read), else decided from the
        rows.

        Those of this code (same name and version) that follow the log (`FOLLOWING`), or whose
        checkpoint is at the head (caught up or rebuilt since), do; the latter are marked as
        following. A row that follows the log but is not this code's (another version, or a
        projection this store does not run) is set to the head: the log moves past it now.
        Such a change moves the epoch on, so the next append decides again. A decision that
        changed no row holds while the epoch does, the log's head moving on included: only a
        checkpoint of this code's ahead of the head could come to equal it."""
        known_epoch, known_following = self._known
        if read.epoch == known_epoch:
            return known_following
        following: set[str] = set()
        changed: list[dict[str, int | str]] = []
        ahead = False
        for _head, _version, _epoch, name, version, checkpoint in read.checkpoints:
            ours = self.versions.get(name) == version
            if checkpoint == FOLLOWING:
                if ours:
                    following.add(name)
                else:
                    changed.append({"name": name, "checkpoint": read.log_head})
            elif ours and checkpoint == read.log_head:
                following.add(name)
                changed.append({"name": name, "checkpoint": FOLLOWING})
            elif ours and checkpoint > read.log_head:
                ahead = True
        if changed:
            execute_many(conn, _SET_CHECKPOINT, changed)
        elif not ahead:
            self._known = (read.epoch, frozenset(following))
        return following

    @property
    def known_epoch(self) -> int:
        """The epoch an append sends with its read of the heads (`trm_store.append_heads`),
        which returns no projection's row while the database holds it."""
        return self._known[0]

    def take_any(self, event_types: Collection[str]) -> bool:
        """Whether a projection of this store takes any of `event_types`."""
        return not self._subscribers.keys().isdisjoint(event_types)

    def apply_inline(
        self, conn: Connection, events: Sequence[RecordedEvent], following: Collection[str]
    ) -> None:
        """Apply `events` to each projection that takes any of them among `following`."""
        if not following:
            return
        present = {e.type for e in events}
        if len(present) == 1:  # most appends: the subscribers are looked up, not searched for
            (only,) = present
            wanted: Collection[str] = self._subscribers.get(only, ())
        else:
            wanted = [
                n for n, p in self.projections.items() if not present.isdisjoint(p.event_types)
            ]
        for name in wanted:
            if name in following:
                projection = self.projections[name]
                projection.apply(
                    conn, self.live[name], of_types(events, projection.event_types, present)
                )

    def stale(self, conn: Connection, names: Collection[str] | None = None) -> dict[str, str]:
        """Projections that cannot be read as they are, with the reason."""
        found = statuses(conn)
        last = head(conn)
        reasons: dict[str, str] = {}
        for name in names if names is not None else self.projections:
            projection = self.projections[name]
            status = found.get(name)
            if status is None:
                reasons[name] = "never built"
            elif status.version != projection.version:
                reasons[name] = f"built at version {status.version}, code is {projection.version}"
            elif status.checkpoint < last:
                reasons[name] = f"at position {status.checkpoint}, log head is {last}"
        return reasons

    def needing_rebuild(self, conn: Connection) -> list[str]:
        """Projections that cannot be caught up incrementally, or whose rebuild was asked for
        and has not finished (`rebuilding`)."""
        found = statuses(conn)
        unbuilt = self.unbuilt(conn, found)
        return [n for n in self.projections if n in unbuilt or found[n].status != "ready"]

    def unbuilt(
        self, conn: Connection, found: Mapping[str, ProjectionStatus] | None = None
    ) -> list[str]:
        """Projections whose live tables this code cannot read: never built, or built at
        another version (a `rebuilding` one at this version is read as it is, kept current)."""
        found = statuses(conn) if found is None else found
        return [
            name
            for name, p in self.projections.items()
            if (s := found.get(name)) is None or s.version != p.version
        ]

    def catch_up(self, write: WriteTransaction, batch_size: int) -> dict[str, int]:
        """Apply the events each current projection has not seen yet; name -> events applied."""
        applied: dict[str, int] = {}
        with write() as conn:
            last = head(conn)
            found = statuses(conn)
            for name, projection in self.projections.items():
                status = found.get(name)
                if status is None or status.version != projection.version:
                    continue
                if status.checkpoint >= last:
                    continue
                applied[name] = _replay(
                    conn, projection, self.live[name], status.checkpoint, last, batch_size
                )
                # A `rebuilding` mark stays: the rebuild asked for is still owed.
                set_status(conn, name, projection.version, last, status.status)
        return applied


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


def requested(
    projections: Mapping[str, Projection], only: str | Collection[str] | None
) -> list[str]:
    """The projections `only` names (one name, several, or None: all), each known."""
    names = list(projections) if only is None else [only] if isinstance(only, str) else list(only)
    require_known(projections, names)
    return names


def require_known(projections: Mapping[str, Projection], names: Collection[str]) -> None:
    """Refuse names that are not registered projections."""
    unknown = sorted(set(names) - set(projections))
    if unknown:
        raise StoreError(f"unknown projection(s) {unknown}; known: {sorted(projections)}")
