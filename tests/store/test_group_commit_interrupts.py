"""Group commit under interrupts (`trm_store.append_queue`): a KeyboardInterrupt, or whatever a
signal handler raises, can land wherever the queue calls a Python function or waits. Wherever it
lands, no caller waits forever, the store keeps writing, an uninterrupted caller's append is
written exactly once, and an interrupted caller's append is never taken up again by another
writer.

A signal's handler runs at the next check for pending calls, which the interpreter makes when a
Python function starts; so raising at the start of each such call the queue makes (a trace
function's "call" event) visits every place a signal can interrupt it, one run per place.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any

import pytest
from sqlalchemy import Connection, Table

import trm_store.append_queue
from tests.store.helpers import TOTALS, Totals, added, replayed_totals, totals, writing_held
from tests.store.interrupt_places import (
    LIMIT,
    InterruptAt,
    Interrupted,
    at_each_place,
    outcome_of,
    wait_for,
)
from trm_store import RecordedEvent, Store, open_store

_QUEUE = trm_store.append_queue.__file__


def _queue_places(at: int, then: int | None = None) -> InterruptAt:
    """Raises at the `at`-th place (and `then` places later) in the queue's code."""
    return InterruptAt(at, then, traced={_QUEUE})


class Slowed(Totals):
    """The test projection, taking 20 ms over each write: appends made together overlap."""

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        super().apply(conn, tables, events)
        time.sleep(0.02)


def _in_thread(
    call: Callable[[], object],
    tracer: InterruptAt | None = None,
    then: Callable[[], object] | None = None,
) -> Any:
    """Run `call` in a thread (traced by `tracer`), then `then` if given; a function that joins
    it and returns its outcome (the call's result or the exception it raised), with `then`'s
    result as its `then` attribute."""
    outcome: list[object] = []
    after: list[object] = []

    def run() -> None:
        if tracer is not None:
            sys.settrace(tracer)
        outcome.append(outcome_of(call))
        sys.settrace(None)
        if then is not None:
            after.append(then())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def joined() -> object:
        thread.join(LIMIT)
        assert not thread.is_alive(), "an append never returned"
        joined.then = after[0] if after else None  # type: ignore[attr-defined]
        return outcome[0]

    joined.thread = thread  # type: ignore[attr-defined]
    return joined


def _check_whole(store: Store) -> list[RecordedEvent]:
    """The queue idle, the store still writing, the log and the projection whole."""
    queue = store._appends
    # A second interrupt may leave an abandoned append queued: the next writer drops it.
    assert not queue._writing and all(q.abandoned for q in queue._queued)
    store.append("afterwards", [added(0)])
    assert not queue._queued
    log = list(store.read_all())
    assert [e.position for e in log] == list(range(1, len(log) + 1))
    assert totals(store) == replayed_totals(store)
    return log


def _appending(store: Store, stream: str, amount: int) -> Callable[[], object]:
    return lambda: store.append(stream, [added(amount)])


def _one_run(
    store: Store, seen: _WritesSeen, run: str, tracer: InterruptAt, victim_first: bool
) -> object:
    """V (traced by `tracer`) and two others append at once; V's outcome, once every thread
    ended, the others' appends returned and the store checked whole."""
    queue = store._appends
    if victim_first:
        v = _in_thread(_appending(store, f"{run}-v", 1), tracer, time.monotonic)
        wait_for(lambda: queue._writing or not v.thread.is_alive(), "V writing")
        others = [_in_thread(_appending(store, f"{run}-o{n}", n)) for n in (2, 3)]
    else:
        others = [_in_thread(_appending(store, f"{run}-o2", 2))]
        wait_for(lambda: queue._writing, "the first writer writing")
        v = _in_thread(_appending(store, f"{run}-v", 1), tracer, time.monotonic)
        others.append(_in_thread(_appending(store, f"{run}-o3", 3)))
    outcome = v()
    for other in others:
        assert isinstance(other(), list), f"{run}: {other()!r}"
    streams = [e.stream_id for e in _check_whole(store)]
    assert [streams.count(f"{run}-o{n}") for n in (2, 3)] == [1, 1], run
    assert streams.count(f"{run}-v") <= 1, run
    if isinstance(outcome, Interrupted) and f"{run}-v" in streams:
        # Written by a write that began before V's caller got the interrupt, not after.
        began = min(t for t, group in seen.groups if f"{run}-v" in group)
        assert began < v.then, run
    return outcome


class _WritesSeen:
    """Notes when each of the queue's writes began and which streams it took: its writes of a
    group (`write_group`) and of one append found alone (`write_one`)."""

    def __init__(self, queue: Any) -> None:
        self.groups: list[tuple[float, set[str]]] = []
        write_group, write_one = queue._write_group, queue._write_one

        def group_seen(group: list[Any]) -> None:
            self._seen([item for queued in group for item in queued.prepared])
            write_group(group)

        def one_seen(prepared: Sequence[Any]) -> Any:
            self._seen(prepared)
            return write_one(prepared)

        queue._write_group, queue._write_one = group_seen, one_seen

    def _seen(self, items: Sequence[Any]) -> None:
        self.groups.append((time.monotonic(), {item.stream_id for item in items}))


@pytest.mark.parametrize("then", [None, 1, 2], ids=["once", "twice", "twice-apart"])
@pytest.mark.parametrize("victim_first", [True, False], ids=["first", "behind-a-writer"])
def test_an_interrupt_at_any_place_in_the_queue_leaves_every_other_append_written_once(
    sqlite_url: str, victim_first: bool, then: int | None
) -> None:
    """Three threads append at once (each write 20 ms); one of them, V, is interrupted at its
    1st, 2nd, ... place (`InterruptAt`), one run each, until a run where V passes fewer places
    than that; and again 1 or 2 places later (a second Ctrl-C). V appends first (and writes,
    mostly), or while another thread writes (and waits, then follows or writes the rest).
    Found by review: an interrupt as V took a group lost it and left the queue marked as
    writing forever; one in `Condition.__exit__` kept the queue's lock; one after the wait,
    or a second one as the first was handled, left V's append queued, to be written later."""
    with open_store(sqlite_url, projections={"test_totals": Slowed()}) as store:
        seen = _WritesSeen(store._appends)

        def run(at: int) -> tuple[InterruptAt, object]:
            tracer = _queue_places(at, then)
            return tracer, _one_run(store, seen, f"r{at}", tracer, victim_first)

        at_each_place(run, more_than=15)


class AgainWhenHandled(InterruptAt):
    """Raises `Interrupted` at the first place after an exception reached the queue's code:
    a second Ctrl-C while the first is being handled."""

    def __init__(self) -> None:
        super().__init__(at=0, traced={_QUEUE})
        self.seen: BaseException | None = None
        self.again: str | None = None

    def _place(self, where: str) -> None:
        if self.seen is not None and self.again is None:
            self.again = where
            sys.settrace(None)
            raise Interrupted(f"again, at {where}")

    def __call__(self, frame: FrameType, event: str, arg: Any) -> InterruptAt | None:
        if event == "exception" and self.seen is None and frame.f_code.co_filename == _QUEUE:
            self.seen = arg[1]
        return super().__call__(frame, event, arg)


def test_a_second_interrupt_as_the_first_is_handled_never_writes_the_append(
    sqlite_url: str,
) -> None:
    """V waits behind a writer; an interrupt reaches it, and a second one lands at the first
    place after, while the queue handles the first. V's append is never written. Found by
    review: the second one, before V's append was marked abandoned and taken out of the
    queue, left it there for the next writer."""
    with open_store(sqlite_url, projections=TOTALS) as store:
        queue = store._appends
        tracer = AgainWhenHandled()
        with writing_held(queue):
            v = _in_thread(_appending(store, "v", 1), tracer)
            wait_for(lambda: len(queue._queued) == 1, "V queued")
            time.sleep(0.05)  # V waiting
            _interrupt(v.thread)
            outcome = v()
        assert isinstance(outcome, Interrupted) and tracer.again is not None, outcome
        assert [e.stream_id for e in _check_whole(store)] == ["afterwards"]


class HeldThenFailed(Totals):
    """The test projection: the first write of stream "w" or "m" waits until `go` is set, then
    fails with `error` (an interrupt reaching the writing thread, or an ordinary error)."""

    def __init__(self, error: BaseException) -> None:
        self.writing, self.go = threading.Event(), threading.Event()
        self.error: BaseException | None = error

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        if self.error is not None and any(e.stream_id in ("w", "m") for e in events):
            self.writing.set()
            assert self.go.wait(LIMIT)
            error, self.error = self.error, None
            raise error
        super().apply(conn, tables, events)


def _interrupt(thread: threading.Thread) -> None:
    """Raise `Interrupted` in `thread` at its next check for pending calls (a queue's wait
    looks again every 0.1 s, and makes one then)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident or 0), ctypes.py_object(Interrupted)
    )


@pytest.mark.parametrize(
    "error", [Interrupted("the writer"), RuntimeError("a projection")], ids=["interrupt", "error"]
)
def test_a_caller_interrupted_while_its_group_is_written_is_not_written_after(
    sqlite_url: str, error: BaseException
) -> None:
    """M's append is in the group W writes; M is interrupted while it waits; then W's write
    fails. Interrupted: W puts the group's other appends back, as retries, but not M's, whose
    caller was told it was interrupted. An ordinary error: `write_group` writes each append of
    the group again alone, but not M's. Found by review (the old queue did the same)."""
    projection = HeldThenFailed(error)
    with open_store(sqlite_url, projections={"test_totals": projection}) as store:
        queue = store._appends
        with writing_held(queue):
            w = _in_thread(lambda: store.append("w", [added(1)]))
            wait_for(lambda: len(queue._queued) == 1, "W queued")
            m = _in_thread(lambda: store.append("m", [added(2)]))
            wait_for(lambda: len(queue._queued) == 2, "M queued")
        assert projection.writing.wait(LIMIT)  # one of the two writes both
        writer, waiter = (w, m) if _writes(w) else (m, w)
        _interrupt(waiter.thread)
        assert isinstance(waiter(), Interrupted)
        projection.go.set()
        written = writer()
        streams = [e.stream_id for e in _check_whole(store)]
        if isinstance(error, Interrupted):
            assert isinstance(written, Interrupted)
            assert streams == ["afterwards"]
        else:  # the writer's own append, written again alone
            assert isinstance(written, list)
            assert streams == [written[0].stream_id, "afterwards"]


def _writes(joined: Any) -> bool:
    """Whether the thread behind `joined` is the one inside the write (in the projection).

    The garbage collector is off while `sys._current_frames` runs: before 3.11.9 it holds the
    interpreter's thread-list lock while it allocates, and a collection that frees a
    `threading.local` (each store's append queue has one) wants that lock too: the test hung
    in CI once (cpython gh-106883)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        frame = sys._current_frames().get(joined.thread.ident)
    finally:
        if was_enabled:
            gc.enable()
    while frame is not None:
        if frame.f_code is HeldThenFailed.apply.__code__:
            return True
        frame = frame.f_back
    return False


def test_a_signal_handler_that_appends_while_its_thread_waits_is_written_alone(
    sqlite_url: str,
) -> None:
    """The main thread waits in the queue behind a writer; a signal's handler appends there:
    its append goes alone, at once, instead of queueing behind its own thread's append (which
    waited for the writer while the handler waited for it: a hang until the writer ended, found
    by review, in the old queue too). Then the main thread's append is written."""
    with open_store(sqlite_url, projections=TOTALS) as store:
        queue = store._appends
        from_handler: list[object] = []
        while_held: list[bool] = []

        def handler(*_: object) -> None:
            from_handler.append(store.append("from-handler", [added(5)]))

        def writer() -> None:
            with writing_held(queue):
                held.set()
                deadline = time.monotonic() + 5
                while not from_handler and time.monotonic() < deadline:
                    time.sleep(0.01)
                while_held.append(bool(from_handler))

        held = threading.Event()
        previous = signal.signal(signal.SIGUSR1, handler)
        try:
            thread = threading.Thread(target=writer, daemon=True)
            thread.start()
            assert held.wait(LIMIT)
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()
            store.append("main", [added(1)])  # waits behind the writer; the handler runs
            thread.join(LIMIT)
        finally:
            signal.signal(signal.SIGUSR1, previous)
        assert while_held == [True]
        assert [e.stream_id for e in _check_whole(store)] == ["from-handler", "main", "afterwards"]
