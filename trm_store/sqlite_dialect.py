"""The `sqlite+trm` dialect: pysqlite whose every SQLAlchemy transaction is a real SQLite one.

Registered with SQLAlchemy by `register_dialect`, which the SQLite backend calls where it builds
its engine: importing this module changes nothing.
"""

from __future__ import annotations

import functools

from sqlalchemy.dialects import registry
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine.interfaces import DBAPIConnection

__all__ = ["DIALECT_NAME", "TransactionalSqliteDialect", "register_dialect"]

DIALECT_NAME = "sqlite.trm"
"""The registry name: engine URLs say `sqlite+trm:///...`."""


class TransactionalSqliteDialect(SQLiteDialect_pysqlite):
    """pysqlite whose every SQLAlchemy transaction is a real SQLite one, begun by `BEGIN`.

    sqlite3 (before Python 3.12) begins transactions only before DML, so a read would see no
    snapshot. SQLAlchemy's documented fix is a `begin` event listener; this is the same `BEGIN`,
    sent by the dialect's `do_begin` instead. A connection event listener switches SQLAlchemy's
    event checks on for every statement of the engine (and `trm_store.driver` keeps to the same
    test): with none, an append's statements skip them.
    """

    supports_statement_cache = True

    def do_begin(self, dbapi_connection: DBAPIConnection) -> None:
        # A writer's transaction has begun already (BEGIN IMMEDIATE, sent on the driver).
        if not dbapi_connection.in_transaction:
            cursor = dbapi_connection.cursor()
            cursor.execute("BEGIN")
            cursor.close()


@functools.cache
def register_dialect() -> None:
    """Make `sqlite+trm` URLs load `TransactionalSqliteDialect`: once per process, and calling
    it again changes nothing."""
    registry.register(DIALECT_NAME, __name__, TransactionalSqliteDialect.__name__)
