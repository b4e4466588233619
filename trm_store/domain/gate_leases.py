"""Gate leases: a gate whose process died is not `running` forever.

A gate's lease is derived from its own events, so the gate writes nothing extra: its holder is the
`host` and `pid` of its `gate.started` event's meta (the store puts the appending process's there
on every event), its heartbeat the time of its last event (`gate.started`, then one
`gate.block_evaluated` per block). `stale_gates` finds `running` gates whose holder is a process
on this host that is gone (at once), or that have written nothing for longer than `older_than`
(so the threshold must exceed the longest block); `mark_stale_gates` appends
`gate.failed(reason="stale")` to each, expecting the stream version it saw: a gate that wrote
meanwhile is left alone, and two markers cannot both append. Idempotent: a failed gate is no
longer `running`.

`takeover_problem` is the other side of the lease, for `Gate.resume`: a gate may be taken over
by a new process when it failed (an error, a cancellation, marked stale) or when it is `running`
but its holder is gone (or, with `older_than`, silent that long); never when it decided or a
live holder may still be writing to it. The taker appends `gate.resumed` at the version it saw
(`gates.RESUMED`), which moves the lease to it and fences the old holder off: any later append
of the old holder expects an older version and fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import select

from trm_store.domain._common import as_utc, validated
from trm_store.domain._liveness import append_unless_moved, cutoff, holder_gone, stale_reason
from trm_store.domain.gates import FAILED, PROJECTION, GateFailed, gate_info, gate_stream
from trm_store.events import NewEvent

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = ["StaleGate", "mark_stale_gates", "stale_gates", "takeover_problem"]


@dataclass(frozen=True, slots=True)
class StaleGate:
    """A `running` gate at stream version `version`, last heard of at `last_seen`, in its block
    `block`; `why` it is presumed dead."""

    gate_id: str
    version: int
    block: int
    last_seen: datetime
    why: str


def stale_gates(
    store: Store, older_than: timedelta, *, now: datetime | None = None
) -> list[StaleGate]:
    """`running` gates whose holder on this host is gone, or silent since `now - older_than`."""
    since = cutoff(now, older_than)
    with store.query(PROJECTION) as (conn, tables):
        gates = tables["gates"]
        rows = conn.execute(
            select(
                gates.c.gate_id,
                gates.c.version,
                gates.c.blocks,
                gates.c.last_event_at,
                gates.c.host,
                gates.c.pid,
            )
            .where(gates.c.status == "running")
            .order_by(gates.c.gate_id)
        ).all()
    found = []
    for row in rows:
        last = as_utc(row.last_event_at)
        why = stale_reason(row.host, row.pid, last, since, heard="last event", silent="no event")
        if why is not None:
            found.append(StaleGate(row.gate_id, row.version, row.blocks + 1, last, why))
    return found


def mark_stale_gates(
    store: Store, older_than: timedelta, *, now: datetime | None = None
) -> list[str]:
    """Append `gate.failed(reason="stale")` to every stale gate, once; the gate ids marked now."""
    marked = []
    for gate in stale_gates(store, older_than, now=now):
        data = {"error": gate.why[:1000], "block": gate.block, "reason": "stale"}
        event = validated(GateFailed, data, f"stale gate {gate.gate_id!r}")
        failed = NewEvent(FAILED, event.model_dump())
        if append_unless_moved(store, gate_stream(gate.gate_id), failed, gate.version):
            marked.append(gate.gate_id)
    return marked


def takeover_problem(
    store: Store, gate_id: str, *, older_than: timedelta | None = None, now: datetime | None = None
) -> tuple[str | None, int, str]:
    """(why the gate cannot be taken over or None, its stream version, what it is taken from).

    UnknownGateError for a gate never started."""
    info = gate_info(store, gate_id)
    version, status = info["version"], info["status"]
    if status == "decided":
        return f"it decided already ({info['verdict']}: {info['reason']})", version, status
    if status == "failed":
        return None, version, f"failed: {info['reason']}"[:1000]
    holder = f"process {info['pid']} on {info['host']}"
    if holder_gone(info["host"], info["pid"]):
        return None, version, f"running, but its {holder} is gone"
    last = info["last_event_at"]
    if older_than is not None and last < cutoff(now, older_than):
        return None, version, f"running, but silent since {last.isoformat()}"
    return (
        f"it is running in {holder} (last event {last.isoformat()}); resume it once that "
        "process is gone, or mark it stale (`trm gates --mark-stale`)",
        version,
        status,
    )
