"""`StoreEventSink`: the governed client's events, appended to the trm_store log off the loop.

Group commit: events emitted on an event loop are queued and written by one writer thread
(`trm_llm.group_commit`): all events queued while a batch is written (or within `linger_s` of
the batch's first event) go into the next `store.append_batch`, one transaction. The governed
client awaits its call's events, so `chat()` returns only once they are committed, and raises
`EventSinkError` if the store failed. Emitted from a thread without a loop, `emit` blocks until
its event is committed (a store error is raised as the store raised it). An event the store
refuses (validation) fails alone: the batch is then written event by event. `flush()` waits for
everything emitted so far; `close()` / `aclose()` flush and stop the writer (at exit it flushes
by itself). With the store work in a child process (`in_child_process`), events emitted on an
event loop are shipped to the child by the loop itself (`trm_llm.sink_loop`), with the same
group commit and the same receipts, and no thread. `trm_store` is imported on first use, so
`import trm_llm` loads no database library.

Each event goes to stream `llm:{source}` (source = the client's `source`, by default its model
name; cache events use source "cache"). The payloads, exactly as the client emits them
(`trm_store.domain.llm_calls` registers a model for each):

call_completed
    call_id: str                  uuid4 hex, the same as ChatResult.call_id
    parent_call_id: str | None
    model: str                    the model asked for
    endpoint: str                 the base URL, any userinfo removed
    profile: str                  the SSE profile ("strict", "lenient_finish_null")
    cache: "off" | "hit" | "miss"
    cache_salt: str | None
    cache_write: "written" | "failed" | "skipped" | None
                                  None when the cache is off or hit; "skipped" for a `length`
                                  (unless cache_length) or another non-"stop" finish
    finish_reason: str
    usage: dict | None            as the server streamed it
    ttft_ms: float | None         None on a cache hit
    max_inter_token_ms: float | None
    latency_ms: float             the whole call, retries and backoff sleeps included
    attempts: list[Attempt]       empty on a cache hit

call_failed
    call_id, parent_call_id, model, endpoint, profile, cache, cache_salt, latency_ms, attempts:
                                  as above (cache is "off" or "miss")
    error: "retries_exhausted" | "fatal" | "circuit_open" | "cancelled" | "unexpected"
    reason: str                   the last attempt's reason, e.g. "truncated_no_done",
                                  "http_429", "ReadError"; for retries_exhausted the last
                                  transient reason
    status: int | None            the last HTTP status, if any
    detail: str                   short message (<= 300 chars), API key redacted

Attempt (one dict per request sent)
    n: int                        1-based
    outcome: "ok" | "retry" | "failed"
    reason: str | None            None when ok; an SseAnomaly reason, "http_<status>", or the
                                  exception class name
    status: int | None            HTTP status, if a response head arrived
    latency_ms: float
    tokens_discarded: int         content/reasoning delta chunks received and thrown away
                                  (0 when ok)
    sleep_s: float | None         backoff slept before the next attempt
    overload: bool                an overload the concurrency limiter handled: retried once a
                                  slot was free, not counted against the breaker or the
                                  attempt budget (`trm_llm.limiter`)

breaker_changed
    from_state: "closed" | "open" | "half_open"
    to_state: "closed" | "open" | "half_open"
    failures: int                 consecutive transient failures at the change
    at: float | None              the clock value at the change (None for a success)
    call_id: str | None           the call that caused it

limit_changed                     the concurrency limiter moved its limit
    from_limit: int, to_limit: int   (>= 1, <= ceiling)
    cause: "overload" | "success"    shrank on an overload signal, grew on successes
    reason: str | None            the overload signal ("RemoteProtocolError", "http_503", ...)
    in_flight: int                calls in flight just after the move
    ceiling: int                  the limiter's ceiling
    call_id: str                  the call whose attempt moved it

No payload ever holds the API key or a request header.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trm_llm.closing import AsyncClosing
from trm_llm.errors import EventSinkError
from trm_llm.group_commit import GroupCommitter, running_loop
from trm_llm.sink_loop import LoopShipper

if TYPE_CHECKING:
    from trm_llm.sink_process import ChildWriter
    from trm_store import NewEvent, Store
    from trm_store.backend import Durability

__all__ = ["StoreEventSink"]

logger = logging.getLogger("trm_llm.sink")
_Event = tuple[str, "NewEvent"]  # (stream id, event)


class StoreEventSink(AsyncClosing):
    """An `EventSink` that appends each event to stream `llm:{source}`, its type prefixed like
    every stored type (`call_completed` is stored as `llm.call_completed`)."""

    def __init__(
        self,
        store: Store,
        *,
        max_pending: int = 4096,
        max_batch: int = 512,
        linger_s: float = 0.002,
    ) -> None:
        self._setup(store, max_pending, max_batch, linger_s)

    def _setup(
        self, store: Store | None, max_pending: int, max_batch: int, linger_s: float
    ) -> None:
        self._store = store
        self._child: ChildWriter | None = None
        self._writer: GroupCommitter[_Event] = GroupCommitter(
            self._write,
            max_pending=max_pending,
            max_batch=max_batch,
            linger_s=linger_s,
            name="trm-llm-sink",
        )
        self._max_batch = max_batch
        self._closed = False
        self._pid = os.getpid()
        self._shippers: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, LoopShipper[_Event]
        ] = weakref.WeakKeyDictionary()
        """The child-process sink's shipper of each event loop it is used on (`sink_loop`)."""

    @classmethod
    def in_child_process(
        cls,
        url: str | None = None,
        *,
        durability: Durability = "normal",
        max_pending: int = 4096,
        max_batch: int = 512,
        linger_s: float = 0.002,
    ) -> StoreEventSink:
        """The same sink, its store work done by a child process that opens the store as
        `open_store(url, durability=durability)` would (`trm_llm.sink_process`): the client's
        process only ships each batch, so the store never takes the event loop's GIL. Emitted
        on an event loop, the batches are shipped by the loop itself (`trm_llm.sink_loop`: no
        writer thread, `linger_s` unused); elsewhere by the writer thread. Blocks until the
        child has opened the store (about a second) and raises the store's error if it could
        not. Every registered projection of trm's domain is kept, as `open_store` keeps
        them; a projection registered only in this process is not (use the thread writer)."""
        from trm_llm.sink_process import ChildWriter

        sink = cls.__new__(cls)
        sink._setup(None, max_pending, max_batch, linger_s)  # checks the arguments first
        sink._child = ChildWriter(url, durability)
        return sink

    def emit(self, source: str, event_type: str, data: Mapping[str, Any]) -> Awaitable[None] | None:
        """Queue the event. On an event loop: returns at once, with an awaitable that completes
        when it is committed (or raises `EventSinkError`). Elsewhere: returns once committed, or
        raises the store's error (`EventValidationError`, `StoreError`) as `append` would (an
        `EventSinkError` if the child process writing them died)."""
        from trm_store import NewEvent, StoreError

        event = (f"llm:{source}", NewEvent(f"llm.{event_type}", dict(data)))
        shipper = self._shipper()
        if shipper is not None:
            return shipper.submit(event)
        receipt = self._writer.submit(event)
        if isinstance(receipt, Awaitable):
            return receipt
        error = receipt.exception()
        if error is None:
            return None
        if isinstance(error.__cause__, StoreError):  # the store's own typed error, as from append
            raise error.__cause__
        raise error

    async def flush(self) -> None:
        """Wait until every event emitted so far is committed or has failed."""
        shipper = self._shippers.get(asyncio.get_running_loop())
        if shipper is not None:
            await shipper.flush()
        await self._writer.flush()

    def close(self) -> None:
        """Flush and stop the writer thread, and the child process if there is one (blocking:
        for threads and scripts; on a loop, `aclose`). What a loop running in another thread
        has queued is flushed by that loop first; what a loop that no longer runs left queued
        is written by the writer thread. Called on a loop's own thread, that loop cannot ship
        while `close` blocks it: its queued and in-flight events fail at once with
        `EventSinkError` (the in-flight ones may or may not be committed)."""
        self._closed = True
        here = running_loop()
        for loop, shipper in list(self._shippers.items()):
            if loop is here:
                shipper.abandon(
                    EventSinkError(
                        "the store sink was closed by its loop's own thread while writing (use"
                        " aclose() on a loop): the event may or may not be committed"
                    )
                )
            elif loop.is_running():
                _wait_flushed(shipper, loop)
            else:
                shipper.drain()
        if here is not None and self._child is not None:
            # This loop cannot finish a request it holds the child's socket for, and the
            # writer thread would wait for that socket: the child goes first, so what the
            # thread still holds fails at once instead of waiting forever.
            self._child.close()
        self._writer.close()
        if self._child is not None:
            self._child.close()

    async def aclose(self) -> None:
        """`close()` without blocking the loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def _shipper(self) -> LoopShipper[_Event] | None:
        """The running loop's shipper, for a child-process sink emitted to on a loop (closed:
        `EventSinkError`)."""
        if self._child is None:
            return None
        loop = running_loop()
        if loop is None:
            return None
        if self._closed:  # before a shipper is made for a loop that never used the sink
            raise EventSinkError("the store sink is closed: nothing more can be written")
        shipper = self._shippers.get(loop)
        if shipper is None:
            shipper = self._shippers[loop] = LoopShipper(
                self._awrite,
                self._writer.submit,
                max_batch=self._max_batch,
                owner=self._pid,
                name="trm-llm-sink",
            )
        return shipper

    async def _awrite(
        self, events: Sequence[_Event], sent: Callable[[], None]
    ) -> list[BaseException | None]:
        assert self._child is not None
        return _sink_errors(events, await self._child.awrite(events, sent))

    def _write(self, events: Sequence[_Event]) -> list[BaseException | None]:
        if self._child is not None:
            return _sink_errors(events, self._child.write(events))
        assert self._store is not None
        return _sink_errors(events, append_events(self._store, events))


def _wait_flushed(shipper: LoopShipper[_Event], loop: asyncio.AbstractEventLoop) -> None:
    """Have `loop` (running in another thread) flush `shipper`, while it runs; if it stops
    first, the writer thread takes what is left."""
    flushed = asyncio.run_coroutine_threadsafe(shipper.flush(), loop)
    while True:
        try:
            flushed.result(timeout=0.1)
            return
        except concurrent.futures.TimeoutError:
            if not loop.is_running():
                break
        except Exception:  # cancelled by the loop's shutdown: its task drains what is left
            break
    flushed.cancel()
    while not shipper.idle() and loop.is_running():  # the cancelled task's drain, on its loop
        time.sleep(0.01)
    if not loop.is_running():
        shipper.drain()  # a stopped loop's task will not: what it left goes to the thread


def append_events(store: Store, events: Sequence[_Event]) -> list[Exception | None]:
    """One transaction for the batch; if the store refuses an event, one per event. Each
    event's store error (None: committed). The thread writer and the child process both
    write with it."""
    from trm_store import EventValidationError

    by_stream: dict[str, list[NewEvent]] = {}
    for stream, event in events:
        by_stream.setdefault(stream, []).append(event)
    try:
        store.append_batch([(s, evs, None) for s, evs in by_stream.items()])
    except EventValidationError as exc:
        if len(events) == 1:
            return [exc]
        return [append_events(store, [event])[0] for event in events]
    except Exception as exc:
        return [exc] * len(events)
    return [None] * len(events)


def _sink_errors(
    events: Sequence[_Event], causes: Sequence[Exception | None]
) -> list[BaseException | None]:
    """Each store error as the sink's typed error (logged here, in the client's process)."""
    return [
        None if cause is None else _failed(e, cause)
        for e, cause in zip(events, causes, strict=True)
    ]


def _failed(event: _Event, cause: Exception) -> EventSinkError:
    """The typed error for one event the store did not take, the store's error chained."""
    stream, new = event
    logger.error("the store sink could not commit %s to %s: %s", new.type, stream, cause)
    error = EventSinkError(f"{new.type} not committed to {stream}: {type(cause).__name__}: {cause}")
    error.__cause__ = cause
    return error
