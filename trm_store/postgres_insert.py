"""An append's event rows on PostgreSQL (fewer than `WITH_COMMIT_BELOW`), sent with the
transaction's `COMMIT` in one round trip.

An append holds the store's lock from the round trip that takes it to the one that commits, and
every round trip in between is time the other writers wait (with 4 writer processes on 2 cores,
the lock's holder waited for its client in 43% of samples of `pg_stat_activity`; 26% with
this). So the rows are the transaction's last statement, one simple query with the `COMMIT`:
`EXECUTE trm_insert_events(<rows>, <time>); COMMIT`. PostgreSQL runs the `COMMIT` only if the
insert succeeded; if it failed, the transaction is left aborted, and the error raised as before.
The projections apply their part first (they read and write only their own tables:
`docs/architecture.md`), except in an append that may be a retry (`trm_store.append`).

The rows travel as one JSON array of arrays (`jsonb`, each event's data and meta in it as JSON
strings, so their text arrives exactly as the log stores it), the time once: one literal for
psycopg to quote, where a literal per value costs ~2 us each in Python.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection

from trm_store.postgres_writers import Prepared, send_simple_query
from trm_store.schema import EVENT_COLUMNS

__all__ = ["INSERT_EVENTS", "WITH_COMMIT_BELOW", "insert_events"]

WITH_COMMIT_BELOW = 64
"""An append of fewer rows goes with the `COMMIT`; one of more as a `COPY`, the `COMMIT` after
(`PostgresBackend.insert_events`). Measured on loopback (raw psycopg, trm's events table,
medians; `bench/README.md`), the server spends ~11.5 us a row on these, ~9.4 on a `COPY`'s, and
the client ~0.7 us more: from some 40-100 rows on, that costs more than the two round trips the
`COPY` needs beyond this one."""

_WIDTH = len(EVENT_COLUMNS)
_CASTS = ("::bigint", "", "", "::int", "", "::int", "::json", "::json")
"""How each value of a row's JSON array becomes its column (all but `recorded_at`, a
parameter of its own): `EVENT_COLUMNS` order."""
INSERT_EVENTS = Prepared(
    "trm_insert_events",
    "PREPARE trm_insert_events(jsonb, timestamptz) AS"
    f" INSERT INTO events ({', '.join(EVENT_COLUMNS)})"
    f" SELECT {', '.join(f'(r->>{k}){cast}' for k, cast in enumerate(_CASTS))}, $2"
    " FROM jsonb_array_elements($1) AS r",
)
_INSERT = f"EXECUTE {INSERT_EVENTS.name}(%(rows)s, %(at)s)"


def insert_events(conn: Connection, values: list[Any], *, commit: bool) -> None:
    """Insert the rows whose values `values` holds one after another (`EVENT_COLUMNS` order,
    every row with the same `recorded_at`) and, if `commit`, commit, in one round trip (nothing
    is sent in a transaction that failed already: `send_simple_query`)."""
    rows = [values[start : start + _WIDTH - 1] for start in range(0, len(values), _WIDTH)]
    params = {"rows": json.dumps(rows), "at": values[_WIDTH - 1]}
    send_simple_query(conn, f"{_INSERT}; COMMIT" if commit else _INSERT, params)
