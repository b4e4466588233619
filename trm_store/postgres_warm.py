"""Whether a PostgreSQL writer connection may carry a whole append, the lock's wait and the
`COMMIT` included, in one query (`PostgresWriters.committed`).

Why: in two queries (the lock, then the insert and `COMMIT`), the append lock is held from its
grant across one turn of the client, which on a busy machine waits for a CPU: every other
writer waits with it (4 writer processes on 2 CPUs: ~10% of their events/s, bench/README.md,
"Twenty-seventh session"), and a client stopped there (SIGSTOP, swapped out, a partitioned
network) holds the lock until the server notices. In one query, the server ends the
transaction without waiting for the client.

What one query must not do is write an append whose caller is gone while it waits for the
lock (review, twenty-third session). So it is sent only on a connection whose server checks
that its client is still there while a query runs (`client_connection_check_interval`,
PostgreSQL 14 and later, set when the connection opens): a writer process killed while it
waits is seen gone within `CLIENT_CHECK_MS`, and its backend ends the query, with nothing
written, unless the lock came free before that. An interrupted caller cancels its query
(`cancel_running`). And a connection the server or the network may have dropped since its last
use, where one query's failure would leave its outcome unknown, takes the lock in a query of its
own first (which fails with nothing written, and the append begins again on a new connection):
one idle for longer than `WARM_FOR` (a NAT forgets a flow after minutes), or one on which
anything arrived while it was idle (the server's goodbye when it terminates a backend or shuts
down).
"""

from __future__ import annotations

import select
import time
from contextlib import suppress
from typing import Any

import psycopg
from sqlalchemy.pool import PoolProxiedConnection

__all__ = ["CLIENT_CHECK_MS", "WARM_FOR", "cancel_running", "used", "warm", "watch_client"]

CLIENT_CHECK_MS = 10
"""How often, in ms, a writer's backend looks at its client's socket while a query runs."""
WARM_FOR = 1.0
"""Seconds after its last transaction a kept connection still takes a whole append in one
query."""
_WATCHED = "trm_client_watched"
_USED_AT = "trm_used_at"


def watch_client(connection: PoolProxiedConnection, raw: psycopg.Connection[Any]) -> None:
    """Make the server check the client of a new writer connection (in autocommit at the
    driver) while its queries run; a server before 14, or one that refuses the setting (on
    Windows and macOS it must stay 0), cannot, and gets two queries an append."""
    if raw.info.server_version < 140000:
        return
    try:
        raw.execute(f"SET client_connection_check_interval = {CLIENT_CHECK_MS}")
    except psycopg.Error:  # refused: Windows and macOS servers, a server without the setting
        return
    connection.info[_WATCHED] = True


_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
"""Linux's monotonic clock that counts a suspend too: a connection used just before a laptop
slept is not warm when it wakes."""


def used(connection: PoolProxiedConnection) -> None:
    """Note that a transaction on `connection` just ended well."""
    connection.info[_USED_AT] = time.clock_gettime(_CLOCK)


def warm(connection: PoolProxiedConnection, raw: psycopg.Connection[Any], *, fresh: bool) -> bool:
    """Whether `connection` may carry a whole append in one query: its server checks its
    client, and it is `fresh` (just opened) or was used within `WARM_FOR` with nothing
    received since."""
    if not connection.info.get(_WATCHED):
        return False
    if fresh:
        return True
    if time.clock_gettime(_CLOCK) - connection.info.get(_USED_AT, float("-inf")) > WARM_FOR:
        return False
    try:
        watched = select.poll()  # not select.select: a descriptor may be past 1023
        watched.register(raw.fileno(), select.POLLIN)
        return not watched.poll(0)
    except Exception:  # a closed connection, whatever else: not warm, and two queries tell
        return False


def cancel_running(raw: psycopg.Connection[Any]) -> None:
    """Ask the server to cancel the query `raw` is running (its caller was interrupted, by an
    exception from a signal handler: psycopg cancels only on KeyboardInterrupt), before the
    connection is closed: a query waiting for the append lock then ends at once, with nothing
    written. The outcome of one that got the lock first is unknown to the caller."""
    if raw.info.transaction_status == psycopg.pq.TransactionStatus.ACTIVE:
        with suppress(Exception):
            raw.cancel_safe(timeout=5.0)
