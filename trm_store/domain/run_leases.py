"""Run leases: a running run's heartbeat, and marking runs whose process died as failed.

A process that is SIGKILLed never appends `completed` or `failed`, so its run would read `running`
forever. A live `RunLog` refreshes a row in `run_leases` (a mutable table outside the event log:
heartbeats are not facts worth keeping); `mark_stale_runs` appends `failed(reason="stale")` for
runs that are `running` but silent for longer than `older_than`, and at once for runs whose lease
holder is a process on this host that no longer exists. The append expects the stream version it
saw, so two markers cannot both append, and a run that wrote meanwhile is left alone. `fail_run`
fails one running run by hand (`trm runs --fail`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import delete, func, select

from trm_store.domain._common import as_utc, check_id, upsert, validated
from trm_store.domain._liveness import append_unless_moved, aware_now, cutoff, stale_reason
from trm_store.domain.errors import RunStateError
from trm_store.domain.runs import FAILED, PROJECTION, Failed, run_info, run_version, stream_of
from trm_store.errors import ConcurrencyError
from trm_store.events import NewEvent
from trm_store.schema import RUN_LEASES

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = ["StaleRun", "fail_run", "mark_stale_runs", "release_lease", "stale_runs", "write_lease"]


@dataclass(frozen=True, slots=True)
class StaleRun:
    """A `running` run not heard from since `last_seen`, at stream version `version`; `why` it
    is presumed dead."""

    run_id: str
    version: int
    last_seen: datetime
    why: str


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
    `now - older_than` (a run that never wrote a lease counts from its registration), and those
    whose lease holder (or, without a lease, registering process) was on this host and is gone."""
    since = cutoff(now, older_than)
    with store.query(PROJECTION) as (conn, tables):
        runs = tables["runs"]
        rows = conn.execute(
            select(
                runs.c.run_id,
                runs.c.version,
                runs.c.last_event_at,
                func.coalesce(RUN_LEASES.c.host, runs.c.host).label("host"),
                func.coalesce(RUN_LEASES.c.pid, runs.c.pid).label("pid"),
                RUN_LEASES.c.heartbeat_at,
            )
            .select_from(runs.outerjoin(RUN_LEASES, RUN_LEASES.c.run_id == runs.c.run_id))
            .where(runs.c.status == "running")
            .order_by(runs.c.run_id)
        ).all()
    found = []
    for row in rows:
        seen = [as_utc(row.last_event_at)]
        if row.heartbeat_at is not None:
            seen.append(as_utc(row.heartbeat_at))
        last = max(seen)
        heard, silent = "last heard of", "no heartbeat"
        why = stale_reason(row.host, row.pid, last, since, heard=heard, silent=silent)
        if why is not None:
            found.append(StaleRun(row.run_id, row.version, last, why))
    return found


def mark_stale_runs(
    store: Store, older_than: timedelta, *, now: datetime | None = None
) -> list[str]:
    """Append `failed(reason="stale")` to every stale run, once; the run ids marked by this call."""
    now = aware_now(now)
    return [run.run_id for run in stale_runs(store, older_than, now=now) if _mark(store, run, now)]


def _mark(store: Store, run: StaleRun, now: datetime) -> bool:
    """Mark one run, unless its stream moved since it was found stale (another marker, or the run
    itself is alive after all)."""
    data = {"finished_at": now, "reason": "stale", "error": run.why}
    if not append_unless_moved(store, stream_of(run.run_id), NewEvent(FAILED, data), run.version):
        return False
    release_lease(store, run.run_id)
    return True


def fail_run(
    store: Store, run_id: str, *, reason: str | None = None, now: datetime | None = None
) -> None:
    """Fail one running run by hand (`failed(reason="operator")`, with `reason` as its error
    text). UnknownRunError if it was never registered, RunStateError if it has ended already
    (or ends while this call runs); nothing is written then."""
    check_id("run_id", run_id)
    now = aware_now(now)
    text = "failed by an operator" if reason is None else reason
    data = {"finished_at": now, "reason": "operator", "error": text}
    event = validated(Failed, data, f"fail_run({run_id!r})")
    info = run_info(store, run_id)
    if info["status"] == "running":
        try:
            store.append(
                stream_of(run_id),
                [NewEvent(FAILED, event.model_dump())],
                expected_version=run_version(store, run_id),
            )
        except ConcurrencyError:
            info = run_info(store, run_id)
        else:
            release_lease(store, run_id)
            return
    raise RunStateError(f"run {run_id!r} is {info['status']} already: only a running run can fail")
