"""SQLite's write transaction under interrupts (`trm_store.sqlite_transaction`, under the
writer lock of `trm_store.sqlite_writer_lock`): a KeyboardInterrupt, or whatever a signal
handler raises, can land wherever that code calls a Python function, gets a call's result back
or loops. Wherever it lands, once the interrupted thread has caught it: that thread appends
again, the store's other threads and other processes append without waiting, a `store.close()`
from another thread does not hang, and the log stays whole, the interrupted append written
whole or not at all. Found by review: an interrupt as the transaction ended left the
connection marked as writing (every later append of the thread refused as nested) and the
writer lock held, the file's `flock` too, until the process exited.

Each place is interrupted in turn, one run each (`InterruptAt`, as in
tests/store/test_group_commit_interrupts.py), until a run passes fewer places than that.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection

import trm_store.sqlite
import trm_store.sqlite_transaction
import trm_store.sqlite_writer_lock
from tests.store.helpers import (
    TOTALS,
    added,
    assert_log_is_whole,
    flock_free,
    in_a_forked_child,
    log_of,
)
from tests.store.interrupt_places import (
    LIMIT,
    InterruptAt,
    Interrupted,
    at_each_place,
    outcome_of,
    wait_for,
)
from trm_store import Store, StoreError, open_store
from trm_store.backend import Durability

QUICK = 4.0
"""Seconds another thread's append may take: well under the busy timeout (`BUSY_S`)."""
BUSY_S = 5
"""The busy timeout the stores are opened with: a writer that waits this long fails."""

_TRACED = {
    trm_store.sqlite.__file__,
    trm_store.sqlite_transaction.__file__,
    trm_store.sqlite_writer_lock.__file__,
}


def _places(at: int, then: int | None = None) -> InterruptAt:
    """Raises at the `at`-th place (and `then` places later) of the write transaction's code,
    the start of each of its functions included."""
    return InterruptAt(at, then, traced=_TRACED, own_starts=True)


class Victim:
    """A thread that appends traced by `tracer` (two events in one append: written whole or
    not at all), then, told to go on, does `after` (another append, or `store.close()`)."""

    def __init__(self, store: Store, run: str, tracer: InterruptAt, after: str) -> None:
        self.outcome: list[object] = []
        self.again: list[object] = []
        self._go = threading.Event()

        def run_it() -> None:
            sys.settrace(tracer)
            self.outcome.append(outcome_of(lambda: store.append(f"{run}-v", [added(1), added(1)])))
            sys.settrace(None)
            assert self._go.wait(LIMIT)
            if after == "append":
                self.again.append(outcome_of(lambda: store.append(f"{run}-again", [added(2)])))
            else:
                self.again.append(outcome_of(store.close))

        self.thread = threading.Thread(target=run_it, daemon=True)
        self.thread.start()

    def interrupted(self) -> object:
        """The first append's outcome."""
        wait_for(lambda: bool(self.outcome), "the victim's append returned")
        return self.outcome[0]

    def go_on(self) -> object:
        """Its second step's outcome."""
        self._go.set()
        self.thread.join(LIMIT)
        assert not self.thread.is_alive(), "the victim's second step never returned"
        return self.again[0]


def _in_another_thread(call: Callable[[], object], within: float, what: object = "") -> object:
    """`call`'s outcome (its result or the exception it raised), run in another thread, which
    must end within `within` seconds."""
    outcome: list[object] = []

    def run() -> None:
        outcome.append(outcome_of(call))

    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(LIMIT)
    assert not thread.is_alive(), "another thread's call never returned"
    took = time.monotonic() - started
    assert took < within, f"{what}: another thread's call took {took:.2f} s: it waited for a lock"
    return outcome[0]


def _in_a_child(url: str, stream: str) -> bytes:
    """A forked child (its own locks and descriptors, as another process's) appends to the
    file through a store of its own: b"ok", or what went wrong."""

    def body() -> bytes:
        try:
            with open_store(url, projections=TOTALS) as child:
                child.append(stream, [added(3)])
            return b"ok"
        except BaseException as e:
            return repr(e).encode()

    return in_a_forked_child(body)


def _flock_free(url: str) -> bool:
    """Whether another open file of `<file>-writer` (as another process) gets its `flock`."""
    return flock_free(url.removeprefix("sqlite:///") + "-writer")


def _one_run(url: str, run: str, tracer: InterruptAt, durability: Durability, after: str) -> object:
    """V appends, interrupted at `tracer`'s place; then (once the interrupt is caught, in an
    order that needs no repair by V first unless it was interrupted twice) V appends again or
    closes the store, another thread appends and closes the store, a child process appends.
    V's first outcome, once the log is checked whole."""
    store = open_store(url, projections=TOTALS, durability=durability)
    try:
        victim = Victim(store, run, tracer, after)
        outcome = victim.interrupted()
        twice = tracer.at != tracer.last
        if not twice:  # nothing held once it was caught: the file lock included, at once
            assert _flock_free(url), f"{run}, interrupted {tracer.where}: the -writer file held"
        if twice:  # the repair may be V's to make: its next write, or its close
            again = victim.go_on()
            assert again is None if after == "close" else isinstance(again, list), again
        what = f"{run}, interrupted {tracer.where}"
        other = _in_another_thread(lambda: store.append(f"{run}-o", [added(4)]), QUICK, what)
        assert isinstance(other, list), f"{what}: another thread's append: {other!r}"
        assert _in_a_child(url, f"{run}-c") == b"ok", what
        if not twice:
            again = victim.go_on()
            assert again is None if after == "close" else isinstance(again, list), again
        assert _in_another_thread(store.close, QUICK, what) is None
        streams = [e.stream_id for e in log_of(store)]
    finally:
        store.close()
    with open_store(url, projections=TOTALS) as fresh:
        assert_log_is_whole(fresh)
    assert streams.count(f"{run}-v") in (0, 2), f"{run}: the interrupted append split"
    if not isinstance(outcome, Interrupted):
        assert streams.count(f"{run}-v") == 2, run
    assert streams.count(f"{run}-o") == 1 and streams.count(f"{run}-c") == 1, run
    assert streams.count(f"{run}-again") == (1 if after == "append" else 0), run
    return outcome


@pytest.mark.parametrize("durability", ["normal", "full"])
@pytest.mark.parametrize(
    ("then", "after"),
    [(None, "append"), (None, "close"), (1, "append"), (1, "close"), (2, "append")],
    ids=["once", "once-then-close", "twice", "twice-then-close", "twice-apart"],
)
def test_an_interrupt_at_any_place_of_a_write_transaction_leaves_nothing_held(
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
    durability: Durability,
    then: int | None,
    after: str,
) -> None:
    """V's append is interrupted at its 1st, 2nd, ... place, one run each, until a run where V
    passes fewer places than that; and again 1 or 2 places later (a second Ctrl-C while the
    first is handled). Interrupted once, nothing stays held once V has caught it: another
    thread and a child process append at once, then V appends again (or closes the store).
    Interrupted twice, V's next append (or close) lets go of whatever the second interrupt
    left held. The interrupted append is written whole or not at all."""
    monkeypatch.setattr(trm_store.sqlite, "BUSY_TIMEOUT_MS", BUSY_S * 1000)

    def run(at: int) -> tuple[InterruptAt, object]:
        tracer = _places(at, then)
        return tracer, _one_run(sqlite_url, f"r{at}", tracer, durability, after)

    at_each_place(run, more_than=30)


def test_a_write_transaction_block_interrupted_as_it_ends_leaves_nothing_held(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`store.write_transaction()`, interrupted as its transaction ends, at each place: the
    thread writes again, and another thread and a child process at once."""
    monkeypatch.setattr(trm_store.sqlite, "BUSY_TIMEOUT_MS", BUSY_S * 1000)
    with open_store(sqlite_url, projections=TOTALS) as store:
        for at in range(1, 400):
            tracer = _places(at)
            outcome = _block_then_append(store, tracer, f"r{at}-again")
            assert isinstance(outcome[1], list), f"run {at}: the thread's next append: {outcome}"
            other = _in_another_thread(partial(store.append, f"r{at}-o", [added(2)]), QUICK, at)
            assert isinstance(other, list), f"run {at}: {other!r}"
            assert _in_a_child(sqlite_url, f"r{at}-c") == b"ok", at
            if tracer.places < at:
                assert outcome[0] is None, outcome
                break
            assert isinstance(outcome[0], Interrupted), f"run {at}: {outcome[0]!r}"
        else:
            pytest.fail("the runs never reached the end of the transaction")
        assert_log_is_whole(store)
        assert at > 5


def _block_then_append(store: Store, tracer: InterruptAt, stream: str) -> list[object]:
    """In a thread: a `store.write_transaction()` block whose end `tracer` traces, then an
    append; the outcome of each (None, the events, or the exception raised)."""
    outcome: list[object] = []

    def block() -> None:
        with store.write_transaction():
            sys.settrace(tracer)  # the transaction's end only

    def run() -> None:
        for step in (block, lambda: store.append(stream, [added(1)])):
            outcome.append(outcome_of(step))
            sys.settrace(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(LIMIT)
    assert not thread.is_alive() and len(outcome) == 2, outcome
    return outcome


def test_the_writer_file_is_free_after_an_interrupt_as_the_lock_is_let_go(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The `flock` of `<file>-writer` itself, looked at from another open file (as another
    process sees it), once an interrupt landed as the writer lock was let go and was caught."""
    monkeypatch.setattr(trm_store.sqlite, "BUSY_TIMEOUT_MS", BUSY_S * 1000)
    writer_file = Path(sqlite_url.removeprefix("sqlite:///") + "-writer")
    with open_store(sqlite_url, projections=TOTALS) as store:
        store.append("s", [added(1)])
        lock = store._backend._writer_lock  # type: ignore[attr-defined]
        release = type(lock).release

        def interrupted_release(*args: Any) -> None:
            type(lock).release = release  # once
            raise Interrupted("as the lock was let go")

        monkeypatch.setattr(type(lock), "release", interrupted_release)
        with pytest.raises(Interrupted):
            store.append("s", [added(2)])
        fd = os.open(writer_file, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if still held
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        store.append("s", [added(3)])
        # Interrupted after its commit: written, its caller told it was interrupted.
        assert [e.data["amount"] for e in log_of(store)] == [1, 2, 3]


class HandlerAt(InterruptAt):
    """Runs `handler` (what a signal handler may do) at the `at`-th place of the write
    transaction's code, instead of raising there: the interrupted code then goes on."""

    def __init__(self, at: int, handler: Callable[[], object]) -> None:
        super().__init__(at, traced=_TRACED, own_starts=True)
        self._handler = handler

    def _place(self, where: str) -> None:
        self.places += 1
        if self.places == self.at:
            sys.settrace(None)  # the handler's own write runs untraced
            self.where.append(where)
            self._handler()


@pytest.mark.parametrize("durability", ["normal", "full"])
@pytest.mark.parametrize("handler", ["appends", "appends-refused", "closes"])
def test_a_signal_handler_writing_to_another_store_at_any_place_leaves_the_write_alone(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch, durability: Durability, handler: str
) -> None:
    """A signal handler runs at each place of an append in turn, one run each, and appends to
    a second store on the same file (refused at its busy timeout while the first holds
    SQLite's write lock, or while another program does) or closes it. The append it
    interrupted goes on: it returns, written once, and leaves nothing held. Found by review: a
    handler that came while the writer lock was being taken or let go found it held with no
    holder named, let it go from under the writer, whose append then raised though written (a
    retry wrote it twice), or left the lock to another thread for good; and by a second
    review: a handler's append refused while the first waited for the lock kept the lock after
    the first's append returned."""
    monkeypatch.setattr(trm_store.sqlite, "BUSY_TIMEOUT_MS", 200)
    for at in range(1, 400):
        first = open_store(sqlite_url, projections=TOTALS, durability=durability)
        second = open_store(sqlite_url, projections=TOTALS, durability=durability)
        try:

            def handle(second: Store = second, stream: str = f"r{at}-h") -> None:
                if handler == "closes":
                    second.close()
                    return
                foreign = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), timeout=0.2)
                try:
                    if handler == "appends-refused":  # another program writing: refused
                        with suppress(sqlite3.OperationalError):  # unless the first is
                            foreign.execute("BEGIN IMMEDIATE")
                    # Refused (its busy timeout) if it came while the first held SQLite's lock.
                    with suppress(StoreError):
                        second.append(stream, [added(5)])
                finally:
                    foreign.close()

            tracer = HandlerAt(at, handle)
            sys.settrace(tracer)
            outcome = outcome_of(partial(first.append, f"r{at}-v", [added(1), added(1)]))
            sys.settrace(None)
            what = f"run {at}, the handler at {tracer.where}"
            assert isinstance(outcome, list), f"{what}: {outcome!r}"
            other = _in_another_thread(partial(first.append, f"r{at}-o", [added(2)]), QUICK, what)
            assert isinstance(other, list), f"{what}: another thread's append: {other!r}"
            assert [e.stream_id for e in log_of(first)].count(f"r{at}-v") == 2, what
        finally:
            second.close()
            first.close()
        if tracer.places < at:
            break
    else:
        pytest.fail("the runs never reached the end of the append")
    with open_store(sqlite_url, projections=TOTALS) as store:
        assert_log_is_whole(store)
    assert at > 30


def test_an_interrupt_in_sqlalchemy_s_commit_leaves_the_thread_writing(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append whose projection runs SQLAlchemy statements commits through SQLAlchemy; an
    interrupt at the start of the dialect's commit makes SQLAlchemy invalidate the connection.
    Found by review: the thread kept that connection, and each of its later appends, and
    `store.close()`, raised "Can't reconnect until invalid transaction is rolled back"."""
    with open_store(sqlite_url, projections=TOTALS) as store:
        store.append("warm", [added(1)])
        dialect = type(store._backend.engine.dialect)  # type: ignore[attr-defined]
        do_commit = dialect.do_commit

        def interrupted(*args: Any) -> None:
            monkeypatch.setattr(dialect, "do_commit", do_commit)  # once
            raise Interrupted("at the start of do_commit")

        monkeypatch.setattr(dialect, "do_commit", interrupted)
        with pytest.raises(Interrupted):
            store.append("cut", [added(2)])
        store.append("again", [added(3)])
        with store.write_transaction():
            pass
        assert [e.stream_id for e in log_of(store)] == ["warm", "again"]
    assert _flock_free(sqlite_url)


def test_a_store_closed_by_its_writing_thread_is_closed_once_the_write_ends(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal handler (or a projection) closes the store as the append it interrupted
    commits: the connection is closed once the write ends, so the append is written and
    returns, and the store is closed after it. Found by review: closed under the write, its
    transaction rolled back, the append returned its events, which were never in the log."""
    store = open_store(sqlite_url, projections=TOTALS)
    store.append("warm", [added(1)])
    commit = Connection.commit

    def closed_first(self: Connection) -> None:
        monkeypatch.setattr(Connection, "commit", commit)  # once
        store.close()
        commit(self)

    monkeypatch.setattr(Connection, "commit", closed_first)
    written = store.append("cut", [added(2)])
    assert store._backend._writers.mine() is None  # type: ignore[attr-defined]  # closed after
    with open_store(sqlite_url, projections=TOTALS) as again:
        assert [e.stream_id for e in log_of(again)] == ["warm", "cut"]
        assert [e.event_id for e in written] == [log_of(again)[-1].event_id]
    assert _flock_free(sqlite_url)
