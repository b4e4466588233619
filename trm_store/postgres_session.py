"""The session settings every connection of a PostgreSQL store gets, whatever the server's,
the database's, the role's or the URL's defaults: dates written in ISO style, and UTC.

psycopg parses dates in no other style: a database set to `DateStyle = 'SQL, DMY'` (or
`German`) made every read of an event fail with psycopg's `NotImplementedError` ("can't parse
timestamptz with DateStyle 'SQL, DMY'"). And a session time zone other than UTC gave back each
event's `recorded_at` in that zone (the same instant, another offset), where a SQLite store
gives UTC. Both are set once per connection, when it is opened, as SQLAlchemy's documentation
sets a session's `search_path`: outside any transaction, so no rollback undoes them.

A caller's own SQL (in `Store.query()` or `write_transaction()`) may change them, or the
`search_path` (the store's tables are named without a schema), or more. A pooled connection a
`query()` block ran on goes back with a fresh session (`_FRESH_SESSION`, at check-in: what the
block committed ends there); a writer connection whose transaction ran a caller's SQL (a
`write_transaction` block, a projection's `apply`) is marked (`callers_sql_ran`), and its next
transaction begins with `RESTORE_SESSION` in the round trip of its `BEGIN` (`restoring`), the
mark kept until such a transaction commits (a rollback undoes the restore too); and each
checkout of the pool looks at what the server last reported for the two above (psycopg keeps
it: no round trip) and sends them again if either differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.pool import PoolProxiedConnection

from trm_store.backend import CALLERS_SQL
from trm_store.postgres_prepared import AS_IS, Prepared, all_prepared

if TYPE_CHECKING:  # a SQLite store never imports the PostgreSQL driver
    import psycopg

__all__ = [
    "RESTORE_SESSION",
    "callers_sql_ran",
    "restored",
    "restoring",
    "set_session_on_connect",
]

_SESSION_SETTINGS = "SET DateStyle = 'ISO'; SET TimeZone = 'UTC'"
RESTORE_SESSION = f"{_SESSION_SETTINGS}; RESET search_path"
"""Sent at the start of a writer's transaction after one that ran a caller's SQL: the settings
above, and the `search_path` the URL or the role gave the session, whatever the caller's SQL
set (another schema would send the store's appends to another log)."""
_FRESH_SESSION = (
    "CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT; RESET ALL; DISCARD TEMP; DISCARD SEQUENCES; "
    f"UNLISTEN *; SELECT pg_advisory_unlock_all(); {_SESSION_SETTINGS}"
)
"""`DISCARD ALL` but the prepared statements (psycopg's own, which it would not know gone), then
the store's settings: every setting back to the session's defaults (the URL's and the role's
`search_path` among them), `SET ROLE` undone, temp tables dropped."""


def callers_sql_ran(connection: PoolProxiedConnection) -> None:
    """Mark `connection`: its transaction runs SQL not trm's."""
    connection.info[CALLERS_SQL] = True


def restoring(
    conn: Connection, connection: PoolProxiedConnection, prepare: Sequence[Prepared]
) -> str:
    """What a writer's transaction on `connection` sends before its first statement: nothing
    for a session that is the store's; else `RESTORE_SESSION`, in the round trip of `BEGIN`;
    or, when a statement of `prepare` must be prepared first (`PREPARE` would plan it under the
    caller's `search_path`), the restore sent now, on its own, outside any transaction (so kept:
    the mark goes), before it."""
    if not connection.info.get(CALLERS_SQL):
        return ""
    if all_prepared(connection, prepare):
        return f"{RESTORE_SESSION}; "
    conn.exec_driver_sql(RESTORE_SESSION, execution_options=AS_IS)
    del connection.info[CALLERS_SQL]
    return ""


def restored(connection: PoolProxiedConnection) -> None:
    """A transaction that ran no caller's SQL committed: the restore it began with, if any,
    holds."""
    connection.info.pop(CALLERS_SQL, None)


def set_session_on_connect(engine: Engine) -> None:
    """Send `_SESSION_SETTINGS` on each new connection of `engine` (a psycopg one), before any
    other listener of its `connect` event, and again at a checkout that finds them changed."""

    @event.listens_for(engine, "connect", insert=True)
    def _set(dbapi_connection: psycopg.Connection[Any], _record: object) -> None:
        _outside_transactions(dbapi_connection, _SESSION_SETTINGS)

    @event.listens_for(engine, "reset")
    def _restore(dbapi_connection: psycopg.Connection[Any], record: Any, state: Any) -> None:
        """A pooled connection a caller's SQL ran on (`Store.query`) goes back with a fresh
        session: whatever the caller committed (a setting, `SET ROLE`, a temp table that would
        hide the store's tables) ends with `_FRESH_SESSION`, one round trip, outside any
        transaction (`reset` has rolled back, or ends what is open now)."""
        if state.terminate_only or not record.info.pop(CALLERS_SQL, False):
            return
        if dbapi_connection.info.transaction_status.name != "IDLE":
            dbapi_connection.rollback()
        _outside_transactions(dbapi_connection, _FRESH_SESSION)

    @event.listens_for(engine, "checkout")
    def _keep(dbapi_connection: psycopg.Connection[Any], record: object, _proxy: object) -> None:
        status = dbapi_connection.info.parameter_status
        if status("TimeZone") != "UTC" or not (status("DateStyle") or "").startswith("ISO,"):
            _set(dbapi_connection, record)


def _outside_transactions(dbapi_connection: psycopg.Connection[Any], sql: str) -> None:
    """`sql` (several statements, no parameters) in autocommit: kept whatever follows."""
    autocommit = dbapi_connection.autocommit
    dbapi_connection.autocommit = True
    try:
        dbapi_connection.execute(sql, prepare=False)
    finally:
        dbapi_connection.autocommit = autocommit
