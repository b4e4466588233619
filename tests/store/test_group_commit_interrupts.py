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
from tests.store.helpers import TOTALS, Totals, added, replayed_totals, totals
from trm_store import RecordedEvent, Store, open_store

LIMIT = 30.0
"""Seconds a thread may take to end (the queue's waits look again every 0.1 s)."""
QUEUE_CODE = {trm_store.append_queue.__file__, threading.__file__}
"""Where the calls that the tests interrupt are made from: the queue and its Condition."""


class Interrupted(BaseException):
    """What the tests raise in a thread: an interrupt, as KeyboardInterrupt is."""


class Slowed(Totals):
    """The test projection, taking 20 ms over each write: appends made together overlap."""

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        super().apply(conn, tables, events)
        time.sleep(0.02)


def _from_the_queue(frame: FrameType) -> bool:
    """A call that the queue's code makes (from `append_queue`, or from the Condition's code
    while the queue waits or notifies), not one inside the write itself."""
    caller = frame.f_back
    if caller is None or caller.f_code.co_filename not in QUEUE_CODE:
        return False
    while caller is not None:
        if caller.f_code.co_filename == trm_store.append_queue.__file__:
            return True
        caller = caller.f_back
    return False


class InterruptAtCall:
    """A trace function that raises `Interrupted` at the start of the `at`-th call the queue
    makes in this thread; `calls` counts them."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.calls = 0

    def __call__(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call" and _from_the_queue(frame):
            self.calls += 1
            if self.calls == self.at:
                sys.settrace(None)
                raise Interrupted(f"at call {self.at}: {frame.f_code.co_qualname}")


def _in_thread(call: Callable[[], object], tracer: InterruptAtCall | None = None) -> Any:
    """Run `call` in a thread (traced by `tracer`); a function that joins it and returns its
    outcome (its result or the exception it raised)."""
    outcome: list[object] = []

    def run() -> None:
        if tracer is not None:
            sys.settrace(tracer)
        try:
            outcome.append(call())
        except BaseException as e:
            outcome.append(e)
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def joined() -> object:
        thread.join(LIMIT)
        assert not thread.is_alive(), "an append never returned"
        return outcome[0]

    joined.thread = thread  # type: ignore[attr-defined]
    return joined


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIMIT
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.001)


def _check_whole(store: Store) -> list[RecordedEvent]:
    """The queue idle, the store still writing, the log and the projection whole."""
    queue = store._appends
    assert not queue._writing and not queue._queued
    store.append("afterwards", [added(0)])
    log = list(store.read_all())
    assert [e.position for e in log] == list(range(1, len(log) + 1))
    assert totals(store) == replayed_totals(store)
    return log


def _appending(store: Store, stream: str, amount: int) -> Callable[[], object]:
    return lambda: store.append(stream, [added(amount)])


def _one_run(store: Store, run: str, tracer: InterruptAtCall, victim_first: bool) -> object:
    """V (traced by `tracer`) and two others append at once; V's outcome, once every thread
    ended, the others' appends returned and the store checked whole."""
    queue = store._appends
    if victim_first:
        v = _in_thread(_appending(store, f"{run}-v", 1), tracer)
        _wait_for(lambda: queue._writing or not v.thread.is_alive(), "V writing")
        others = [_in_thread(_appending(store, f"{run}-o{n}", n)) for n in (2, 3)]
    else:
        others = [_in_thread(_appending(store, f"{run}-o2", 2))]
        _wait_for(lambda: queue._writing, "the first writer writing")
        v = _in_thread(_appending(store, f"{run}-v", 1), tracer)
        others.append(_in_thread(_appending(store, f"{run}-o3", 3)))
    outcome = v()
    for other in others:
        assert isinstance(other(), list), f"{run}: {other()!r}"
    streams = [e.stream_id for e in _check_whole(store)]
    assert [streams.count(f"{run}-o{n}") for n in (2, 3)] == [1, 1], run
    assert streams.count(f"{run}-v") <= 1, run
    return outcome


@pytest.mark.parametrize("victim_first", [True, False], ids=["first", "behind-a-writer"])
def test_an_interrupt_at_any_call_of_the_queue_leaves_every_other_append_written_once(
    sqlite_url: str, victim_first: bool
) -> None:
    """Three threads append at once (each write 20 ms); one of them, V, is interrupted at its
    1st, 2nd, ... call from the queue's code, one run each, until a run where V makes fewer
    calls than that. V appends first (and writes, mostly), or while another thread writes
    (and waits, then follows or writes the rest). Found by review: an interrupt as V took a
    group lost it and left the queue marked as writing forever; one in `Condition.__exit__`
    kept the queue's lock; one after the wait left V's append queued, to be written later."""
    with open_store(sqlite_url, projections={"test_totals": Slowed()}) as store:
        for at in range(1, 80):
            tracer = InterruptAtCall(at)
            outcome = _one_run(store, f"r{at}", tracer, victim_first)
            if tracer.calls < at:  # V made fewer calls than `at`: every place was visited
                assert isinstance(outcome, list), f"run {at}: {outcome!r}"
                break
            assert isinstance(outcome, Interrupted), f"run {at}: {outcome!r}"
        else:
            pytest.fail("V kept making calls: the runs never reached the end of its append")
        assert at > 5  # the runs did interrupt V at several places


class HeldThenInterrupted(Totals):
    """The test projection: a write of stream "w" waits until `go` is set, then is
    interrupted (as a Ctrl-C reaching the writing thread)."""

    def __init__(self) -> None:
        self.writing, self.go = threading.Event(), threading.Event()

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        if any(e.stream_id in ("w", "m") for e in events):
            self.writing.set()
            assert self.go.wait(LIMIT)
            raise Interrupted("the writer")
        super().apply(conn, tables, events)


def _interrupt(thread: threading.Thread) -> None:
    """Raise `Interrupted` in `thread` at its next check for pending calls (a queue's wait
    looks again every 0.1 s, and makes one then)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread.ident or 0), ctypes.py_object(Interrupted)
    )


def test_a_caller_interrupted_while_its_group_is_written_is_not_written_by_the_next_writer(
    sqlite_url: str,
) -> None:
    """M's append is in the group W writes; M is interrupted while it waits; then W's write
    is interrupted. W puts the group's other appends back, as retries, but not M's: its
    caller was told it was interrupted. Found by review (the old queue did the same)."""
    projection = HeldThenInterrupted()
    with open_store(sqlite_url, projections={"test_totals": projection}) as store:
        queue = store._appends
        with _writing_held(queue):
            w = _in_thread(lambda: store.append("w", [added(1)]))
            _wait_for(lambda: len(queue._queued) == 1, "W queued")
            m = _in_thread(lambda: store.append("m", [added(2)]))
            _wait_for(lambda: len(queue._queued) == 2, "M queued")
        assert projection.writing.wait(LIMIT)  # one of the two writes both
        writer, waiter = (w, m) if _writes(w) else (m, w)
        _interrupt(waiter.thread)
        assert isinstance(waiter(), Interrupted)
        projection.go.set()
        assert isinstance(writer(), Interrupted)
        assert [e.stream_id for e in _check_whole(store)] == ["afterwards"]


def _writes(joined: Any) -> bool:
    """Whether the thread behind `joined` is the one inside the write (in the projection)."""
    frame = sys._current_frames().get(joined.thread.ident)
    while frame is not None:
        if frame.f_code is HeldThenInterrupted.apply.__code__:
            return True
        frame = frame.f_back
    return False


class _writing_held:
    """This thread in the place of the queue's writer until the block ends."""

    def __init__(self, queue: trm_store.append_queue.AppendQueue) -> None:
        self._queue = queue

    def __enter__(self) -> None:
        with self._queue._lock:
            assert not self._queue._writing
            self._queue._writing = True

    def __exit__(self, *_: object) -> None:
        with self._queue._lock:
            self._queue._writing = False
            self._queue._changed.notify_all()


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
            with _writing_held(queue):
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
