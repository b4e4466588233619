"""Group commit: items handed over from any thread or event loop, written in batches by one thread.

`GroupCommitter(write)` starts a writer thread on first use. `submit(item)` queues an item and
returns a receipt: on an event loop, an `asyncio.Future` that completes when the batch holding the
item is written (so awaiting it never blocks the loop); elsewhere, a `concurrent.futures.Future`.
Everything queued while a batch is written goes into the next one (up to `max_batch`), and the
writer waits up to `linger_s` after a batch's first item for more, so concurrent producers share
one write. The writer calls `write(batch)`, which returns one error (or
None) per item; a raised exception fails the whole batch. Items are written in the order they
were submitted.

The queue is bounded: a producer outside an event loop blocks while `max_pending` items wait. A
producer on an event loop is never blocked; its receipt is its backpressure (the governed client
returns from `chat()` only once its events are written, so callers go at the writer's pace).
`flush()` waits for everything submitted before it; `close()` flushes and stops the
thread. A process that exits without closing flushes at exit. A committer belongs to the
process that made it: in a forked copy `submit` raises `EventSinkError` (instead of waiting
for a thread that was not forked).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from trm_llm.errors import EventSinkError, LLMConfigError

__all__ = ["GroupCommitter", "Receipt", "mark_retrieved", "resolve_all", "running_loop"]

Item = TypeVar("Item")
Receipt = asyncio.Future[None] | concurrent.futures.Future[None]
Write = Callable[[Sequence[Item]], Sequence[BaseException | None]]


@dataclass(frozen=True)
class _Entry(Generic[Item]):
    item: Item | None  # None: a flush marker
    receipt: Receipt
    loop: asyncio.AbstractEventLoop | None


class GroupCommitter(Generic[Item]):
    """One writer thread and its queue; see the module docstring."""

    def __init__(
        self,
        write: Write[Item],
        *,
        max_pending: int,
        max_batch: int,
        linger_s: float = 0.0,
        name: str,
    ) -> None:
        if max_pending < 1 or max_batch < 1 or not linger_s >= 0:
            raise LLMConfigError("max_pending and max_batch must be >= 1, linger_s >= 0")
        self._write = write
        self._max_pending = max_pending
        self._max_batch = max_batch
        self._linger_s = linger_s
        self._name = name
        self._queue: collections.deque[_Entry[Item]] = collections.deque()
        lock = threading.Lock()
        self._has_items = threading.Condition(lock)  # the writer waits on it
        self._has_room = threading.Condition(lock)  # blocked producers wait on it
        self._thread: threading.Thread | None = None
        self._closed = False
        self._pid = os.getpid()

    def submit(self, item: Item | None) -> Receipt:
        """Queue `item` (None: nothing to write, only wait for what is queued before it)."""
        if os.getpid() != self._pid:  # its writer thread (and its locks' owner) did not fork
            raise EventSinkError(
                f"{self._name} belongs to process {self._pid}: a forked process cannot use it"
            )
        loop = running_loop()
        receipt: Receipt
        if loop is None:
            receipt = concurrent.futures.Future()
        else:
            receipt = loop.create_future()
            receipt.add_done_callback(mark_retrieved)  # an unawaited failure is the sink's to log
        with self._has_items:
            if self._closed:
                raise EventSinkError(f"{self._name} is closed: nothing more can be written")
            while loop is None and len(self._queue) >= self._max_pending:
                self._has_room.wait()
            self._queue.append(_Entry(item, receipt, loop))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
                atexit.register(self.close)
            # Wake the writer only when it waits for a first item, or should stop lingering:
            # one wake-up per batch, not one per item.
            if len(self._queue) == 1 or len(self._queue) >= self._max_batch or item is None:
                self._has_items.notify()
        return receipt

    async def flush(self) -> None:
        """Wait (on the loop, without blocking it) until everything submitted so far is written."""
        await _awaited(self.submit(None))

    def close(self) -> None:
        """Write what is queued, then stop the thread (blocking; for threads and exit). A
        second caller also waits until the queue is written. In a forked copy of the process
        there is nothing to stop: the thread was its parent's."""
        if os.getpid() != self._pid:
            return
        with self._has_items:
            first = not self._closed
            self._closed = True
            self._has_items.notify()
            thread = self._thread
        if first:
            atexit.unregister(self.close)
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._has_items:
                while not self._queue and not self._closed:
                    self._has_items.wait()
                if not self._queue:
                    return  # closed and drained
                deadline = time.monotonic() + self._linger_s
                while len(self._queue) < self._max_batch and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._queue[-1].item is None:  # a flush: no lingering
                        break
                    self._has_items.wait(left)
                n = min(len(self._queue), self._max_batch)
                batch = [self._queue.popleft() for _ in range(n)]
                self._has_room.notify_all()
            self._settle(batch, self._written(batch))
            del batch  # not kept while waiting: its receipts hold their loops

    def _written(self, batch: list[_Entry[Item]]) -> list[BaseException | None]:
        items = [e.item for e in batch if e.item is not None]
        try:
            errors = list(self._write(items)) if items else []
        except Exception as exc:  # the whole batch failed
            errors = [exc] * len(items)
        it = iter(errors)
        return [None if e.item is None else next(it) for e in batch]

    @staticmethod
    def _settle(batch: list[_Entry[Item]], errors: list[BaseException | None]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Receipt, BaseException | None]]] = {}
        for entry, error in zip(batch, errors, strict=True):
            if entry.loop is None:
                _resolve(entry.receipt, error)
            else:
                by_loop.setdefault(entry.loop, []).append((entry.receipt, error))
        for loop, done in by_loop.items():  # one wake-up per loop per batch
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(resolve_all, done)


async def _awaited(receipt: Receipt) -> None:
    if isinstance(receipt, asyncio.Future):
        await receipt
    else:
        await asyncio.wrap_future(receipt)


def mark_retrieved(receipt: asyncio.Future[None]) -> None:
    """A done callback: marks the receipt's exception as retrieved, so asyncio does not log an
    unawaited failure (the sink logs it itself)."""
    if not receipt.cancelled():
        receipt.exception()


def resolve_all(done: Iterable[tuple[Receipt, BaseException | None]]) -> None:
    """Settle each receipt with its outcome (None: written), skipping one already done."""
    for receipt, error in done:
        _resolve(receipt, error)


def _resolve(receipt: Receipt, error: BaseException | None) -> None:
    if receipt.done():  # cancelled by a waiter that gave up
        return
    if error is None:
        receipt.set_result(None)
    else:
        receipt.set_exception(error)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop of this thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
