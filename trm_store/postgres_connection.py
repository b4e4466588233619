"""What a PostgreSQL writer (`trm_store.postgres_writers`) does with psycopg's connection
itself, under SQLAlchemy's: find it, read a query's last rows, see whether the server closed it
while idle, close it at once."""

from __future__ import annotations

import select
from contextlib import suppress
from typing import Any

import psycopg
from sqlalchemy.pool import PoolProxiedConnection

__all__ = ["LastRowsCursor", "close_now", "driver_connection", "has_input"]


def driver_connection(connection: PoolProxiedConnection) -> psycopg.Connection[Any]:
    """psycopg's connection under the pool's proxy (None once SQLAlchemy invalidated it: take
    it before anything that may)."""
    raw = connection.dbapi_connection
    assert isinstance(raw, psycopg.Connection)  # the driver `trm_store.connect` selects
    return raw


class LastRowsCursor(psycopg.Cursor[Any]):
    """A cursor that, after a query of several statements, holds the rows of the last one that
    returned any, as `last_rows` (psycopg's moves to the first result: here `BEGIN`'s, which has
    none; and in a transaction sent whole the last is `COMMIT`'s)."""

    last_rows: list[Any]

    def execute(self, *args: Any, **kwargs: Any) -> LastRowsCursor:
        super().execute(*args, **kwargs)
        self.last_rows = []
        while True:
            if self.description is not None:
                self.last_rows = self.fetchall()
            if not self.nextset():
                return self


def has_input(raw: psycopg.Connection[Any]) -> bool:
    """Whether the server sent anything to an idle connection: only an error before it closes
    it, or the close itself, can come then (a writer listens to no channel)."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(raw.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([raw.fileno()], [], [], 0)[0])


def close_now(raw: psycopg.Connection[Any]) -> None:
    """Close the driver's connection at once, in whatever state (the server rolls back)."""
    with suppress(Exception):
        raw.close()
