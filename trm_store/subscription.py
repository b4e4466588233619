"""Following the log live (`Store.subscribe`): catch up from a position, then wait for commits.

A subscription owns one connection of its own, outside the store's pool, opened at its first
read: it reads batches in snapshots (`trm_store.log.log_batch`, so it never skips a late commit
nor repeats an event: the cursor only moves forward, over positions) and waits on the backend's
wake-ups (`trm_store.wakeups`) when caught up. Closing it (or leaving its `with` block, breaking
out of its loop, cancelling the task iterating it) closes that connection.

Every database call runs in `_step`, which waits at most `STEP_S`, under a lock: the async
iterator runs each step on a thread of the subscription's own (a step waits there for commits:
on asyncio's default executor a few dozen idle subscriptions starved every `to_thread` of the
process), so the event loop never blocks. `close` from another thread waits for the step in
flight (at most `CLOSE_WAIT_S`) instead of closing a connection in use; from a signal handler
of the stepping thread it cannot wait for itself: the step closes it as it ends.

`position` follows what is handed out, event by event, not what was read: a loop that stops
mid-batch resumes from it without a gap. A closed subscription hands out nothing more, not even
the rest of a batch read before.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Self

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from trm_store.errors import StoreError
from trm_store.events import RecordedEvent
from trm_store.log import LogBatch, log_batch
from trm_store.log_filter import LogFilter
from trm_store.wakeups import Wakeups, wakeups

__all__ = ["Subscription"]

STEP_S = 0.1
"""The longest one step waits for a wake-up: how soon a close or cancel takes effect."""
CLOSE_WAIT_S = 2 * STEP_S
"""How long `close` waits for a step in flight to let the connection go (a read of a long batch
may take longer: that step then closes it)."""


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
        """Where the next read starts."""
        self._position = after
        self._stepping: int | None = None
        """The thread whose step holds the lock (a signal handler there must not wait for it)."""
        self._thread: ThreadPoolExecutor | None = None
        """The async iterator's own thread, made at its first step."""
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
        """Every matching event up to this position has been handed out: resume from it."""
        return self._position

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

    def _step(self) -> LogBatch | None:
        """The next batch (possibly empty after a wait of at most STEP_S); None once closed."""
        with self._lock:
            self._stepping = threading.get_ident()
            try:
                if self._closed:
                    return None
                batch = self._read()
                self._cursor = batch.cursor
                self._caught_up = batch.complete
                return batch
            finally:
                self._stepping = None
                if self._closed:  # meanwhile, by a signal handler or another thread
                    self._let_go()

    def _read(self) -> LogBatch:
        try:
            conn, wake = self._open()
            if self._caught_up and not wake.wait(STEP_S):
                return LogBatch([], self._cursor, True)
            with wake.answered(), conn.begin():  # its COMMIT answered in time too
                return log_batch(conn, self._filter, self._cursor, self._batch_size)
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

    def _handed(self, batch: LogBatch) -> Iterator[RecordedEvent]:
        """`batch`'s events one by one, `position` moving with each, until closed."""
        for event in batch.events:
            if self._closed:
                return
            self._position = event.position
            yield event
        if not self._closed:
            self._position = batch.cursor  # past every event of the batch, and the last cursor

    def __iter__(self) -> Iterator[RecordedEvent]:
        """The events, as they are committed; breaking out of the loop closes the subscription."""
        try:
            while (batch := self._step()) is not None:
                yield from self._handed(batch)
        finally:
            self.close()

    async def __aiter__(self) -> AsyncIterator[RecordedEvent]:
        """`__iter__` for `async for`: each database call runs on the subscription's own
        thread, never on the loop nor on its default executor."""
        loop = asyncio.get_running_loop()
        try:
            while (batch := await loop.run_in_executor(self._own_thread(), self._step)) is not None:
                for event in self._handed(batch):
                    yield event
        finally:
            await self.aclose()

    def _own_thread(self) -> ThreadPoolExecutor:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="trm-subscription")
        return self._thread

    def close(self) -> None:
        """Stop: nothing more is handed out, and the connection is let go, now or (a step still
        reading past `CLOSE_WAIT_S`, or this a signal handler interrupting the step) by the step
        as it ends."""
        self._closed = True
        if self._stepping == threading.get_ident():
            return
        if self._lock.acquire(timeout=CLOSE_WAIT_S):
            try:
                self._let_go()
            finally:
                self._lock.release()

    def _let_go(self) -> None:
        conn, self._conn, self._wakeups = self._conn, None, None
        if conn is not None:
            conn.close()

    async def aclose(self) -> None:
        """`close`, off the event loop; the async iterator's thread ends with it."""
        await asyncio.to_thread(self.close)
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.shutdown(wait=False)

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
        self._lock, self._stepping, self._thread = threading.Lock(), None, None


_OPEN: weakref.WeakSet[Subscription] = weakref.WeakSet()
"""Every subscription of this process, for the at-fork hook."""
_inherited: list[Connection] = []
"""A forked child's references to its parent's connections: never closed, never used."""


def _forget_in_child() -> None:
    for subscription in list(_OPEN):
        subscription._forget_after_fork()


os.register_at_fork(after_in_child=_forget_in_child)
