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
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from trm_llm.errors import EventSinkError
from trm_llm.group_commit import mark_retrieved, resolve_all

__all__ = ["LoopShipper"]

Item = TypeVar("Item")
AsyncWrite = Callable[[Sequence[Item]], Awaitable[Sequence[BaseException | None]]]
"""Writes a batch; one error (None: committed) per item. Raising fails the whole batch."""


class LoopShipper(Generic[Item]):
    """The queue of one event loop and the task that ships it; see the module docstring."""

    def __init__(self, write: AsyncWrite[Item], *, max_batch: int, name: str) -> None:
        self._write = write
        self._max_batch = max_batch
        self._name = name
        self._queue: list[tuple[Item, asyncio.Future[None]]] = []
        self._in_flight: list[asyncio.Future[None]] = []
        self._task: asyncio.Task[None] | None = None
        self._pid = os.getpid()

    def submit(self, item: Item) -> asyncio.Future[None]:
        """Queue `item` (on this shipper's loop); its receipt."""
        if os.getpid() != self._pid:
            raise EventSinkError(
                f"{self._name} belongs to process {self._pid}: a forked process cannot use it"
            )
        receipt = asyncio.get_running_loop().create_future()
        receipt.add_done_callback(mark_retrieved)  # an unawaited failure is the sink's to log
        self._queue.append((item, receipt))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._ship(), name=self._name)
        return receipt

    async def flush(self) -> None:
        """Wait until everything submitted so far is committed or has failed."""
        waiting = [receipt for _, receipt in self._queue] + self._in_flight
        if waiting:
            await asyncio.wait(waiting)

    async def _ship(self) -> None:
        try:
            while self._queue:
                batch = self._queue[: self._max_batch]
                del self._queue[: self._max_batch]
                self._in_flight = [receipt for _, receipt in batch]
                try:
                    outcomes = await self._write([item for item, _ in batch])
                except Exception as exc:  # the whole batch failed
                    outcomes = [exc] * len(batch)
                except BaseException:  # cancelled: this batch, and what waits, cannot be sent
                    for _, receipt in batch + self._queue:
                        receipt.cancel()
                    self._queue.clear()
                    raise
                resolve_all(zip((receipt for _, receipt in batch), outcomes, strict=True))
                self._in_flight = []
        finally:
            self._task = None
