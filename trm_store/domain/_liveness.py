"""Lease staleness, shared by run and gate leases: whether a lease's holder is known to be gone (a
process on this host whose pid no longer exists), why a `running` stream is presumed dead, and the
append of its failure that leaves a stream which moved meanwhile alone. Anything else (another
host, a pid we may not signal, a pid reused by a new process) is left to the age threshold."""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from trm_store.domain.errors import DomainInputError
from trm_store.errors import ConcurrencyError
from trm_store.events import NewEvent

if TYPE_CHECKING:
    from trm_store.store import Store

__all__ = ["append_unless_moved", "aware_now", "cutoff", "holder_gone", "stale_reason"]


def aware_now(now: object) -> datetime:
    """`now` if it is an aware datetime, the current time for None, else DomainInputError."""
    if now is None:
        return datetime.now(UTC)
    if not isinstance(now, datetime) or now.tzinfo is None:
        raise DomainInputError(f"now must be an aware datetime, got {now!r}")
    return now


def cutoff(now: object, older_than: object) -> datetime:
    """`now - older_than`: the time before which a silent lease is stale. `now` as `aware_now`
    takes it; `older_than` a positive timedelta reaching no further back than year 1 (what a
    datetime, and so both backends' timestamps, hold), else DomainInputError."""
    if not isinstance(older_than, timedelta) or older_than <= timedelta(0):
        raise DomainInputError(f"older_than must be a positive timedelta, got {older_than!r}")
    start = aware_now(now)
    try:
        return start - older_than
    except OverflowError:
        raise DomainInputError(
            f"older_than {older_than} reaches back before year 1 from {start.isoformat()}"
        ) from None


def holder_gone(host: str | None, pid: int | None) -> bool:
    """True if `pid` on `host` is this host's and no process has that pid any more."""
    if host != socket.gethostname() or pid is None or pid <= 0:
        return False  # pid 0 or below would signal a process group, never ask about those
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # it exists, owned by someone else (PermissionError), or cannot be told
    return False


def stale_reason(
    host: str | None, pid: int | None, last: datetime, cutoff: datetime, *, heard: str, silent: str
) -> str | None:
    """Why a `running` stream last heard of at `last` is presumed dead, or None if it is not:
    its holder on this host is gone (`... gone ({heard} {last})`), or it has been silent since
    before `cutoff` (`{silent} since {last}; ...`)."""
    if holder_gone(host, pid):
        return f"its process {pid} on {host} is gone ({heard} {last.isoformat()})"
    if last < cutoff:
        return f"{silent} since {last.isoformat()}; the process is presumed dead"
    return None


def append_unless_moved(store: Store, stream: str, event: NewEvent, version: int) -> bool:
    """Append `event` to `stream` expecting it at `version`; False if the stream moved meanwhile
    (it wrote, so it is alive after all, or another marker was first)."""
    try:
        store.append(stream, [event], expected_version=version)
    except ConcurrencyError:
        return False
    return True
