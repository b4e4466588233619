"""The `sqlite+trm` dialect: pysqlite whose every SQLAlchemy transaction is a real SQLite one.

Registered with SQLAlchemy by `register_dialect` (with an adapter for the driver), which the
SQLite backend calls where it builds its engine: importing this module changes nothing.
"""

from __future__ import annotations

import functools
import sqlite3

from sqlalchemy.dialects import registry
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.engine.interfaces import DBAPIConnection

from trm_store.json_codec import JsonText

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
    """Make `sqlite+trm` URLs load `TransactionalSqliteDialect`, and sqlite3 bind `JsonText` as
    the text it is: once per process, and calling it again changes nothing.

    The adapter is for speed alone. sqlite3 binds an exact `str` at once; for anything else,
    such as the `JsonText` (a `str` subclass) of every event's data and meta and of every JSON
    column of a projection, it first looks for a registered adapter, then for `__adapt__` on its
    protocol type, whose miss formats an AttributeError that it drops (~1,700 instructions a
    value), then for the value's `__conform__`, before binding it as text all the same. With the
    adapter, the first lookup finds `str` (a copy of the text; `writers_instructions.py`, 50-event
    appends: 124,715 -> 121,550 instructions an event). Registered for trm's own type only, so
    no one else's binding changes (an adapter a program registered for `JsonText` is replaced).
    """
    registry.register(DIALECT_NAME, __name__, TransactionalSqliteDialect.__name__)
    sqlite3.register_adapter(JsonText, str)
