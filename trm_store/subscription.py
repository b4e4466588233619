"""Following the log live (`Store.subscribe`): catch up from a position, then wait for commits.

A subscription owns one connection of its own, outside the store's pool, opened at its first
read: it reads batches in snapshots (`trm_store.log.log_batch`, so it never skips a late commit
nor repeats an event: the cursor only moves forward, over positions) and waits on the backend's
wake-ups (`trm_store.wakeups`) when caught up. Closing it (or leaving its `with` block, breaking
out of its loop, cancelling the task iterating it) closes that connection.

Every database call runs in `_step`, which waits at most `STEP_S`, under a lock: the async
iterator runs each step in a thread (`asyncio.to_thread`), so the event loop never blocks, and
`close` from any thread waits for the step in flight instead of closing a connection in use.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Self

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from trm_store.errors import StoreError
from trm_store.events import RecordedEvent
from trm_store.log import log_batch
from trm_store.log_filter import LogFilter
from trm_store.wakeups import Wakeups, wakeups

__all__ = ["Subscription"]

STEP_S = 0.1
"""The longest one step waits for a wake-up: how soon a close or cancel takes effect."""


class Subscription:
    """Every event matching the filter after a position, in position order, as it is committed.

    Iterate it (`for`), or iterate it asynchronously (`async for`); close it with `close()` /
    `aclose()` or a (async) `with` block. Iteration ends when it is closed.
    """

    def __init__(
        self,
        engine: Engine,
        after: int,
        log_filter: LogFilter | None,
        batch_size: int,
        store_error: Callable[[SQLAlchemyError], StoreError],
    ) -> None:
        self._engine = engine
        self._cursor = after
        self._filter = log_filter
        self._batch_size = batch_size
        self._store_error = store_error
        self._lock = threading.Lock()
        self._closed = False
        self._conn: Connection | None = None
        self._wakeups: Wakeups | None = None
        self._caught_up = False
        _OPEN.add(self)

    @property
    def position(self) -> int:
        """Every matching event up to this position has been handed out."""
        return self._cursor

    @property
    def closed(self) -> bool:
        return self._closed

    def _open(self) -> tuple[Connection, Wakeups]:
        if self._conn is None or self._wakeups is None:
            conn = self._engine.connect()
            try:
                if conn.dialect.name == "postgresql":
                    conn = conn.execution_options(isolation_level="REPEATABLE READ")
                conn.detach()  # its own: closing it closes it, nothing pooled keeps LISTENing
                self._wakeups = wakeups(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn, self._wakeups

    def _step(self) -> list[RecordedEvent] | None:
        """The next batch (possibly empty after a wait of at most STEP_S); None once closed."""
        with self._lock:
            if self._closed:
                return None
            try:
                conn, wake = self._open()
                if self._caught_up and not wake.wait(STEP_S):
                    return []
                with conn.begin():
                    batch = log_batch(conn, self._filter, self._cursor, self._batch_size)
            except SQLAlchemyError as e:
                raise self._store_error(e) from e
            except self._engine.dialect.loaded_dbapi.Error as e:
                # The wake-ups' own calls to the driver (psycopg's `notifies`): a connection
                # lost while waiting. Closed at once, with no reset sent on a dead socket.
                if self._conn is not None:
                    self._conn.invalidate()
                raise self._store_error(
                    DBAPIError.instance(None, None, e, type(e), dialect=self._engine.dialect)
                ) from e
            self._cursor = batch.cursor
            self._caught_up = batch.complete
            return batch.events

    def __iter__(self) -> Iterator[RecordedEvent]:
        """The events, as they are committed; breaking out of the loop closes the subscription."""
        try:
            while (batch := self._step()) is not None:
                yield from batch
        finally:
            self.close()

    async def __aiter__(self) -> AsyncIterator[RecordedEvent]:
        """`__iter__` for `async for`: each database call runs in a thread, never on the loop."""
        try:
            while (batch := await asyncio.to_thread(self._step)) is not None:
                for event in batch:
                    yield event
        finally:
            await self.aclose()

    def close(self) -> None:
        """Stop: release the connection (waits for a step in flight, at most STEP_S)."""
        self._closed = True
        with self._lock:
            conn, self._conn, self._wakeups = self._conn, None, None
            if conn is not None:
                conn.close()

    async def aclose(self) -> None:
        """`close`, off the event loop."""
        await asyncio.to_thread(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    def _forget_after_fork(self) -> None:
        """In a forked child: not the parent's connection (closing it would end the parent's
        session, whose socket the child shares), and a fresh lock (a parent's thread that held it
        at the fork does not exist here). A later step opens a connection of the child's own."""
        if self._conn is not None:
            _inherited.append(self._conn)
        self._conn, self._wakeups, self._caught_up = None, None, False
        self._lock = threading.Lock()


_OPEN: weakref.WeakSet[Subscription] = weakref.WeakSet()
"""Every subscription of this process, for the at-fork hook."""
_inherited: list[Connection] = []
"""A forked child's references to its parent's connections: never closed, never used."""


def _forget_in_child() -> None:
    for subscription in list(_OPEN):
        subscription._forget_after_fork()


os.register_at_fork(after_in_child=_forget_in_child)
