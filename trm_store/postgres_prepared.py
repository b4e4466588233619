"""Statements a PostgreSQL writer connection prepares once for its session (`PREPARE`), and
how it knows they are still there: psycopg's own prepared statements come and go behind them
(`trm_store.postgres_writers` uses them for every append)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import Connection
from sqlalchemy.pool import PoolProxiedConnection

__all__ = ["AS_IS", "NO_SUCH_PREPARED_STATEMENT", "Prepared", "ensure_prepared", "unsure"]

_PREPARED = "trm_prepared"
"""The key, in a writer connection's `info`, of the statements its session prepared: name ->
True (there), False (unsure: a rollback since, which may have deallocated it)."""
NO_SUCH_PREPARED_STATEMENT = "26000"
_IS_PREPARED = "SELECT 1 FROM pg_prepared_statements WHERE name = %(name)s"
AS_IS = {"no_parameters": True}
"""Send the text with no parameter collection: psycopg then reads no placeholders in it (a `%`
in a quoted value stays as it is) and sends it as a simple query."""


class Prepared(NamedTuple):
    """A statement a writer connection prepares once: its name, and the `PREPARE` that makes
    it."""

    name: str
    statement: str


def ensure_prepared(
    conn: Connection, connection: PoolProxiedConnection, prepared: Prepared
) -> None:
    """Prepare the statement in the session unless it is there. After a rollback it may not
    be: psycopg's rollback sends `DEALLOCATE ALL` when it holds prepared statements of its own
    (a canary test checks it still does), which takes this one too; when it holds none, or the
    rollback followed a failed `COMMIT`, it stays. So the session is asked (one round trip, after
    a rollback only), and nothing else deallocates psycopg's statements behind its back."""
    state: dict[str, bool] = connection.info.setdefault(_PREPARED, {})
    there = state.get(prepared.name)
    if there is True:
        return
    if there is None or not conn.exec_driver_sql(_IS_PREPARED, {"name": prepared.name}).first():
        conn.exec_driver_sql(prepared.statement, execution_options=AS_IS)  # autocommit: kept
    state[prepared.name] = True


def all_prepared(connection: PoolProxiedConnection, statements: Sequence[Prepared]) -> bool:
    """Whether each of `statements` is known to be prepared in the connection's session (so
    `ensure_prepared` sends nothing)."""
    state: dict[str, bool] = connection.info.get(_PREPARED, {})
    return all(state.get(prepared.name) is True for prepared in statements)


def unsure(connection: PoolProxiedConnection) -> None:
    """After a rollback: whether each prepared statement is still there is unknown."""
    state: dict[str, bool] = connection.info.get(_PREPARED, {})
    for name in state:
        state[name] = False
