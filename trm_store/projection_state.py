"""The projections' bookkeeping rows (`projection_state`), and which events a projection takes.

Shared by the inline runner and the rebuild: a row says the version a projection was built at,
the last position it applied (or `FOLLOWING`), and whether it is `ready` or `rebuilding`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, case, delete, func, insert, select, update

from trm_store.events import RecordedEvent
from trm_store.schema import EVENTS, FOLLOWING, PROJECTION_STATE

__all__ = [
    "FOLLOWING",
    "ProjectionStatus",
    "mark_rebuilding",
    "of_types",
    "set_status",
    "statuses",
]


@dataclass(frozen=True, slots=True)
class ProjectionStatus:
    """A projection's bookkeeping row; `checkpoint` is the log's head for one that follows it
    (`FOLLOWING`). `head` is the log's head read with it, in the same snapshot: `head -
    checkpoint` is how far behind it is (read apart, an append in between could make it
    negative)."""

    name: str
    version: int
    checkpoint: int
    status: str
    head: int


def _now() -> datetime:
    return datetime.now(UTC)


_ROWS = PROJECTION_STATE.c
_HEAD = select(func.coalesce(func.max(EVENTS.c.position), 0)).scalar_subquery()
_CHECKPOINT = case((_ROWS.checkpoint == FOLLOWING, _HEAD), else_=_ROWS.checkpoint)
"""A row's checkpoint as a position: the log's head, in the reader's snapshot, for one that
follows it."""
_STATUSES = select(_ROWS.name, _ROWS.version, _CHECKPOINT, _ROWS.status, _HEAD)


def statuses(conn: Connection) -> dict[str, ProjectionStatus]:
    """Every projection's row, by name, its checkpoint a position (never `FOLLOWING`)."""
    return {
        name: ProjectionStatus(name, version, int(checkpoint), status, int(head))
        for name, version, checkpoint, status, head in conn.execute(_STATUSES)
    }


def set_status(conn: Connection, name: str, version: int, checkpoint: int, status: str) -> None:
    """Replace `name`'s row."""
    conn.execute(delete(PROJECTION_STATE).where(PROJECTION_STATE.c.name == name))
    conn.execute(
        insert(PROJECTION_STATE).values(
            name=name, version=version, checkpoint=checkpoint, status=status, updated_at=_now()
        )
    )


def mark_rebuilding(conn: Connection, name: str) -> None:
    """Mark `name` as being rebuilt (a new row at version 0 if it has none): if the rebuild
    dies, the next writable open rebuilds it again."""
    if name not in statuses(conn):
        set_status(conn, name, 0, 0, "rebuilding")
        return
    conn.execute(
        update(PROJECTION_STATE)
        .where(PROJECTION_STATE.c.name == name)
        .values(status="rebuilding", updated_at=_now())
    )


def of_types(
    events: Sequence[RecordedEvent], types: frozenset[str], present: set[str]
) -> Sequence[RecordedEvent]:
    """The events of `types`, given the types `present` among them: no pass over the events
    when none or all of them are wanted (a rebuild is mostly the latter, for one projection)."""
    if present <= types:
        return events
    if present.isdisjoint(types):
        return ()
    return [e for e in events if e.type in types]
