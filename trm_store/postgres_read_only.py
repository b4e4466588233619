"""What makes a read-only PostgreSQL store read-only whatever SQL a caller sends through the
connection `store.query()` hands out.

Session settings cannot do it: `SET default_transaction_read_only = off`, `SET SESSION
CHARACTERISTICS ...` or `COMMIT; BEGIN READ WRITE` undo them. Instead, on every connection of a
read-only engine:

- psycopg begins every transaction `READ ONLY` itself, whatever the session defaults say;
- every statement is sent as one prepared statement (`prepare_threshold = 0`), so the server
  refuses a string of several statements (`COMMIT; BEGIN READ WRITE; UPDATE ...`);
- after each statement, a connection whose transaction ended, or is no longer read-only (a
  `SET TRANSACTION READ WRITE` in a transaction chained by `COMMIT AND CHAIN`), is closed at
  once (its open transaction dies with it) and the statement raises `ReadOnlyStoreError`. Only
  a statement that ends a transaction can make a write persist, and none runs after one;
- the store's read transactions end in ROLLBACK, so session settings changed in them die with
  them, and a connection going back to the pool releases the session advisory locks it took.

A caller who reaches the DBAPI connection itself (`conn.connection.driver_connection`) or makes
an engine of its own is outside all this: a database role with SELECT privileges only is the
guarantee against that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, event

from trm_store.errors import ReadOnlyStoreError

if TYPE_CHECKING:  # a SQLite store never imports the PostgreSQL driver
    import psycopg

__all__ = ["guard_read_only"]

_UNCHANGING = frozenset({"SELECT", "SHOW", "LOCK", "SAVEPOINT", "RELEASE"})
"""Command tags of statements that cannot end a transaction or make it read-write."""


def _still_read_only(cursor: psycopg.Cursor[Any]) -> bool:
    connection = cursor.connection
    if connection.info.transaction_status.name != "INTRANS":
        return False  # the caller ended the transaction: whatever comes next is not ours
    if (cursor.statusmessage or "").split(" ", 1)[0] in _UNCHANGING:
        return True
    row = connection.execute("SHOW transaction_read_only", prepare=False).fetchone()
    return row is not None and row[0] == "on"


def guard_read_only(engine: Engine, describe: str) -> None:
    """Install the listeners above on `engine` (a psycopg one)."""

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: psycopg.Connection[Any], _record: object) -> None:
        dbapi_connection.read_only = True
        dbapi_connection.prepare_threshold = 0

    @event.listens_for(engine, "after_cursor_execute")
    def _check(conn: Connection, cursor: psycopg.Cursor[Any], *_args: object) -> None:
        if not _still_read_only(cursor):
            conn.invalidate()
            raise ReadOnlyStoreError(
                f"store {describe} is read-only: a statement ended its read-only transaction "
                "or made it read-write; the connection was closed and nothing was written"
            )

    @event.listens_for(engine, "reset")
    def _reset(dbapi_connection: psycopg.Connection[Any], _record: object, state: Any) -> None:
        if state.terminate_only:
            return
        dbapi_connection.rollback()
        dbapi_connection.autocommit = True
        try:
            dbapi_connection.execute("SELECT pg_advisory_unlock_all()", prepare=False)
        finally:
            dbapi_connection.autocommit = False
