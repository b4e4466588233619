"""Run leases: a running run's heartbeat, and marking runs whose process died as failed.

A process that is SIGKILLed never appends `completed` or `failed`, so its run would read `running`
forever. A live `RunLog` refreshes a row in `run_leases` (a mutable table outside the event log:
heartbeats are not facts worth keeping); `mark_stale_runs` appends `failed(reason="stale")` for
runs that are `running` but silent for longer than `older_than`. The append expects the stream
version it saw, so two markers cannot both append, and a run that wrote meanwhile is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import delete, select

from trm_store.domain._common import as_utc, upsert
from trm_store.domain.errors import DomainInputError
from trm_store.domain.runs import FAILED, PROJECTION, stream_of
from trm_store.errors import ConcurrencyError
from trm_store.events import NewEvent
from trm_store.schema import RUN_LEASES

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = ["StaleRun", "mark_stale_runs", "release_lease", "stale_runs", "write_lease"]


@dataclass(frozen=True, slots=True)
class StaleRun:
    """A `running` run not heard from since `last_seen`, at stream version `version`."""

    run_id: str
    version: int
    last_seen: datetime


def write_lease(store: Store, run_id: str, *, host: str, pid: int, now: datetime) -> None:
    """Create or refresh the run's lease (its heartbeat)."""
    values = {"run_id": run_id, "host": host, "pid": pid, "heartbeat_at": now}
    with store.write_transaction() as conn:
        upsert(conn, RUN_LEASES, [values], keys=("run_id",), update=("host", "pid", "heartbeat_at"))


def release_lease(store: Store, run_id: str) -> None:
    """Drop the run's lease (it ended, one way or another)."""
    with store.write_transaction() as conn:
        conn.execute(delete(RUN_LEASES).where(RUN_LEASES.c.run_id == run_id))


def stale_runs(
    store: Store, older_than: timedelta, *, now: datetime | None = None
) -> list[StaleRun]:
    """`running` runs whose last heartbeat and last status event are both older than
    `now - older_than` (a run that never wrote a lease counts from its registration)."""
    if not isinstance(older_than, timedelta) or older_than <= timedelta(0):
        raise DomainInputError(f"older_than must be a positive timedelta, got {older_than!r}")
    if now is None:
        now = datetime.now(UTC)
    elif not isinstance(now, datetime) or now.tzinfo is None:
        raise DomainInputError(f"now must be an aware datetime, got {now!r}")
    cutoff = now - older_than
    with store.query(PROJECTION) as (conn, tables):
        runs = tables["runs"]
        rows = conn.execute(
            select(runs.c.run_id, runs.c.version, runs.c.last_event_at, RUN_LEASES.c.heartbeat_at)
            .select_from(runs.outerjoin(RUN_LEASES, RUN_LEASES.c.run_id == runs.c.run_id))
            .where(runs.c.status == "running")
            .order_by(runs.c.run_id)
        ).all()
    found = []
    for row in rows:
        seen = [as_utc(row.last_event_at)]
        if row.heartbeat_at is not None:
            seen.append(as_utc(row.heartbeat_at))
        if max(seen) < cutoff:
            found.append(StaleRun(row.run_id, row.version, max(seen)))
    return found


def mark_stale_runs(
    store: Store, older_than: timedelta, *, now: datetime | None = None
) -> list[str]:
    """Append `failed(reason="stale")` to every stale run, once; the run ids marked by this call."""
    now = now or datetime.now(UTC)
    return [run.run_id for run in stale_runs(store, older_than, now=now) if _mark(store, run, now)]


def _mark(store: Store, run: StaleRun, now: datetime) -> bool:
    """Mark one run, unless its stream moved since it was found stale (another marker, or the run
    itself is alive after all)."""
    data = {
        "finished_at": now,
        "reason": "stale",
        "error": f"no heartbeat since {run.last_seen.isoformat()}; the process is presumed dead",
    }
    try:
        store.append(stream_of(run.run_id), [NewEvent(FAILED, data)], expected_version=run.version)
    except ConcurrencyError:
        return False
    release_lease(store, run.run_id)
    return True
