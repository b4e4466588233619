"""Every run at a glance: its `runs` row, how many predictions it recorded, and its lease's age.

The listing behind `trm runs` (and any other view of the runs): one query over the `runs`
projection (which keeps each run's prediction count) joined with `run_leases`, oldest run first.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, TypedDict

from sqlalchemy import select

from trm_store.domain._common import as_utc, check_id, check_int
from trm_store.domain.runs import PROJECTION
from trm_store.schema import RUN_LEASES

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = ["RunListing", "list_runs", "run_statuses"]


class RunListing(TypedDict):
    """One run as `list_runs` gives it (times are aware UTC datetimes)."""

    run_id: str
    status: str
    """`running`, `completed` or `failed`."""
    reason: str | None
    """Why it failed (e.g. `stale`), if it did."""
    started_at: datetime
    ended_at: datetime | None
    predictions: int
    host: str
    pid: int
    last_event_at: datetime
    heartbeat_at: datetime | None
    """The lease's last heartbeat; None once the run released it (or never held one)."""
    lease_age_s: float | None
    """Seconds from the heartbeat to `now`, rounded to ms."""


def list_runs(store: Store, *, now: datetime, newest: int | None = None) -> list[RunListing]:
    """Every run (or the `newest` last started), oldest first, with its lease's age at `now`
    (an aware datetime)."""
    if newest is not None:
        check_int("newest", newest, minimum=1)
    with store.query(PROJECTION) as (conn, tables):
        runs = tables["runs"]
        query = (
            select(
                runs.c.run_id,
                runs.c.status,
                runs.c.reason,
                runs.c.started_at,
                runs.c.finished_at,
                runs.c.host,
                runs.c.pid,
                runs.c.last_event_at,
                runs.c.predictions,
                RUN_LEASES.c.heartbeat_at,
            )
            .select_from(runs.outerjoin(RUN_LEASES, RUN_LEASES.c.run_id == runs.c.run_id))
            .order_by(runs.c.started_at.desc(), runs.c.run_id.desc())
        )
        rows = conn.execute(query if newest is None else query.limit(newest)).all()[::-1]
    return [
        {
            "run_id": r.run_id,
            "status": r.status,
            "reason": r.reason,
            "started_at": as_utc(r.started_at),
            "ended_at": None if r.finished_at is None else as_utc(r.finished_at),
            "predictions": r.predictions,
            "host": r.host,
            "pid": r.pid,
            "last_event_at": as_utc(r.last_event_at),
            "heartbeat_at": None if r.heartbeat_at is None else as_utc(r.heartbeat_at),
            "lease_age_s": None
            if r.heartbeat_at is None
            else round((now - as_utc(r.heartbeat_at)).total_seconds(), 3),
        }
        for r in rows
    ]


def run_statuses(store: Store, run_ids: Sequence[str]) -> dict[str, str]:
    """The status of each of `run_ids` that was registered (a page that shows only statuses
    reads no more than them: one primary-key read per id)."""
    ids = [check_id("run_id", run_id) for run_id in run_ids]
    found: dict[str, str] = {}
    with store.query(PROJECTION) as (conn, tables):
        runs = tables["runs"]
        for i in range(0, len(ids), _CHUNK):
            query = select(runs.c.run_id, runs.c.status).where(
                runs.c.run_id.in_(ids[i : i + _CHUNK])
            )
            found.update((r.run_id, r.status) for r in conn.execute(query))
    return found


_CHUNK = 500  # run ids per IN (...) query
