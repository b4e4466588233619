"""What the PostgreSQL append tests share: an admin connection of their own in the test's
schema, the append lock held by hand, a wait on `pg_stat_activity`, and a writer process that
appends on a word from its stdin."""

from __future__ import annotations

import time

import psycopg

from trm_store.connect import normalise_url
from trm_store.postgres import APPEND_LOCK_NAMESPACE

WRITER_CHILD = """
import sys
from tests.store.helpers import noted
from trm_store import open_store
store = open_store(sys.argv[1], projections={})
store.append("s", [noted(1)])  # its statements prepared
print("ready", flush=True)
sys.stdin.readline()
store.append("s", [noted(2)])
print("written", flush=True)
"""
"""A writer process: appends once, says "ready", appends again once it reads a line."""


def libpq(url: str) -> str:
    """The store URL as psycopg's own connection string."""
    return normalise_url(url).replace("postgresql+psycopg", "postgresql")


def admin(url: str, sql: str) -> list[tuple[object, ...]]:
    """Run `sql` on a connection of its own, in the test's schema; its rows, if any."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        cursor = conn.execute(sql)
        return cursor.fetchall() if cursor.description is not None else []


def hold_the_append_lock(holder: psycopg.Connection[object]) -> None:
    """Take the store's append lock in `holder`'s transaction (released at its end)."""
    holder.execute(
        "SELECT pg_advisory_xact_lock(%s, hashtext(current_schema()))", (APPEND_LOCK_NAMESPACE,)
    )


def wait_for(url: str, condition: str, *, present: bool = True) -> bool:
    """Whether, within 10 s, a backend other than this query's own meets `condition` (none
    does, when not `present`)."""
    for _ in range(500):
        found = admin(
            url,
            "SELECT 1 FROM pg_stat_activity"
            f" WHERE pid <> pg_backend_pid() AND datname = current_database() AND {condition}",
        )
        if bool(found) == present:
            return True
        time.sleep(0.02)
    return False
