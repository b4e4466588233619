"""Group commit on the event loop: the child-process sink's batches shipped by the loop itself.

With a writer thread, every batch costs the client a thread hand-off each way (the thread woken
for the first event, the loop woken for the receipts) and the GIL passed back and forth while
the loop is busy: measured at concurrency 32, the child-process sink cost 1.19-1.28x plain
httpx, against 1.10-1.11x when the loop ships the batches (`bench/llm_bench.py`). Here a task
of the loop takes every event queued so far (up to `max_batch`), sends them to the child in one
request (`ChildWriter.awrite`) and settles their receipts; events emitted meanwhile queue for
the next request, so concurrent calls share a transaction as with the thread. The task ends
when the queue is empty and starts again with the next event.

One `LoopShipper` serves one event loop; the sink keeps one per loop it is used on. Each
receipt is an `asyncio.Future` of that loop, done when the event is committed or failed (the
governed client awaits it: its callers go at the writer's pace, so the queue needs no bound of
its own). A process forked from the client cannot use it (`EventSinkError`).

What the task will not ship goes to the sink's writer thread (`drain`, receipts chained): when
the task is cancelled (even before its first step: `asyncio.run` ending with events nobody
awaited, such as the cache's), and when `close()` is called on the loop's own thread. A batch
cancelled mid-request may or may not be written: its receipts are cancelled, and the child
(whose socket is then out of step) is shut down by `ChildWriter.awrite`.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import Generic, TypeVar

from trm_llm.errors import EventSinkError
from trm_llm.group_commit import Receipt, mark_retrieved, resolve_all

__all__ = ["LoopShipper"]

Item = TypeVar("Item")
AsyncWrite = Callable[
    [Sequence[Item], Callable[[], None]], Awaitable[Sequence[BaseException | None]]
]
"""Writes a batch, calling its second argument once the whole batch is sent (cancelled before,
none of it is written); one error (None: committed) per item. Raising fails the whole batch."""
Fallback = Callable[[Item], "Receipt"]
"""Queues one item with the writer thread; its receipt."""


class LoopShipper(Generic[Item]):
    """The queue of one event loop and the task that ships it; see the module docstring."""

    def __init__(
        self,
        write: AsyncWrite[Item],
        fallback: Fallback[Item],
        *,
        max_batch: int,
        owner: int,
        name: str,
    ) -> None:
        self._write = write
        self._fallback = fallback
        self._max_batch = max_batch
        self._owner = owner  # the pid of the process that made the sink
        self._name = name
        self._queue: list[tuple[Item, asyncio.Future[None]]] = []
        self._in_flight: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None
        self._draining = threading.Lock()

    def submit(self, item: Item) -> asyncio.Future[None]:
        """Queue `item` (on this shipper's loop); its receipt."""
        if os.getpid() != self._owner:
            raise EventSinkError(
                f"{self._name} belongs to process {self._owner}: a forked process cannot use it"
            )
        loop = asyncio.get_running_loop()
        receipt = loop.create_future()
        receipt.add_done_callback(mark_retrieved)  # an unawaited failure is the sink's to log
        self._queue.append((item, receipt))
        if self._task is None or self._task.done():  # done already: an eager task factory
            self._task = loop.create_task(self._ship(), name=self._name)
            self._task.add_done_callback(self._shipped)
        return receipt

    async def flush(self) -> None:
        """Wait until everything submitted so far is committed or has failed (the task ends
        when the queue is empty)."""
        task = self._task
        if task is not None and not task.done():
            await asyncio.wait([task])

    def idle(self) -> bool:
        """Whether no task is shipping (or will drain) this queue."""
        return self._task is None

    def drain(self) -> None:
        """Hand what is queued to the fallback (the sink's writer thread), receipts chained:
        for a task that will not ship it (cancelled, its loop ending or blocked in `close`)."""
        with self._draining:  # close() in another thread and the task's end may both drain
            queued, self._queue = self._queue, []
        for item, receipt in queued:
            if receipt.done():
                continue
            try:
                _chain(self._fallback(item), receipt)
            except Exception as exc:  # the writer thread is closed too
                receipt.set_exception(exc)

    def abandon(self, error: BaseException) -> None:
        """Fail every queued and in-flight receipt with `error` (on the loop's thread, while
        the loop cannot run: `close` called on it)."""
        queued, self._queue = self._queue, []
        resolve_all((receipt, error) for receipt in self._in_flight + [r for _, r in queued])

    async def _ship(self) -> None:
        while self._queue:
            batch = self._queue[: self._max_batch]
            del self._queue[: self._max_batch]
            self._in_flight = [receipt for _, receipt in batch]
            sent = False

            def on_sent() -> None:
                nonlocal sent
                sent = True

            try:
                outcomes = await self._write([item for item, _ in batch], on_sent)
            except Exception as exc:  # the whole batch failed
                outcomes = [exc] * len(batch)
            except BaseException:
                if sent:  # cancelled mid-request: the batch may or may not be written
                    for receipt in self._in_flight:
                        receipt.cancel()
                else:  # not (wholly) sent, so not written: to the thread with the rest (`drain`)
                    self._queue[:0] = batch
                raise
            finally:
                self._in_flight = []
            resolve_all(zip((receipt for _, receipt in batch), outcomes, strict=True))

    def _shipped(self, task: asyncio.Task[None]) -> None:
        """The task ended. Cancelled (even before its first step), what it left queued goes to
        the thread, so an event nobody awaited is still written when the loop ends."""
        if task.cancelled():
            self.drain()
        if task is self._task:  # after the drain: `idle()` tells close() the queue is handed on
            self._task = None  # no reference to a finished task, nor through it to its loop


def _chain(source: Receipt, target: asyncio.Future[None]) -> None:
    """Settle `target` as `source` settles (a loop future or a thread's future)."""

    def settle(done: Receipt) -> None:
        error = None if done.cancelled() else done.exception()
        with suppress(RuntimeError):  # its loop is closed: nobody waits any more
            target.get_loop().call_soon_threadsafe(resolve_all, [(target, error)])

    source.add_done_callback(settle)
