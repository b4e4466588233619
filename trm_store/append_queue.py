"""Group commit: appends that threads of one process make to one store at once are written
together, in one transaction.

An append that finds no one writing or waiting is written at once, alone. Any other queues
here, then waits until it is decided or no one is writing. A thread that finds no one writing
takes every queued append, its own and those queued while the last write ran, and
writes them in one transaction (`Appender.write_group`): one BEGIN, one heads read, one INSERT,
one projection step and one COMMIT (one fsync at `durability="full"`) for all of them, where each
would have paid its own. When it is done it wakes every waiting thread at once: those whose
append it decided return, and one of the others writes what queued meanwhile. So writers that
contend share the work that serialises them, and the more of them wait, the more each commit
carries; an append that no other thread contends with is written alone, as before.

A decided append's caller returns as soon as its group is committed, whoever writes next: an
earlier version had each caller take a turn lock to find out, and the next group's writer could
take it first, so the callers of one group waited for the next group's commit too, with nothing
to do (bench/README, "Seventeenth session").

What each caller sees is unchanged: `append` returns once its own events are committed, is
atomic (all of its events, or none), and fails alone (a stream not at its expected version
refuses that append, not the others: `write_group` decides each one). It is the technique of
databases' own commit paths (PostgreSQL's `commit_delay`, InnoDB's group commit), without their
wait: a group is whatever queued during the previous write.
"""

from __future__ import annotations

import os
import threading
import weakref
from _thread import LockType, allocate_lock
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import TypeVar

from trm_store.errors import StoreError
from trm_store.events import RecordedEvent
from trm_store.prepared import PreparedAppend
from trm_store.written import Written

__all__ = ["AppendQueue", "QueuedAppend"]

T = TypeVar("T")


@dataclass(slots=True, eq=False)
class QueuedAppend:
    """One caller's append, and once decided its outcome: where it was written, or the error."""

    prepared: Sequence[PreparedAppend]
    written: Written | None = None
    error: Exception | None = None
    abandoned: bool = False
    """Its caller was interrupted before it was decided: no writer takes it up again."""

    @property
    def decided(self) -> bool:
        return self.written is not None or self.error is not None

    def outcome(self) -> Written:
        """Where it was written; else the error that refused it, raised."""
        if self.error is not None:
            raise self.error
        if self.written is None:
            raise StoreError("an append was left undecided: nothing of it was written")
        return self.written


WriteGroup = Callable[[list[QueuedAppend]], None]
"""Writes a group and decides every append in it; only a BaseException that is no Exception
(an interrupt) leaves some undecided."""
WriteOne = Callable[[Sequence[PreparedAppend]], Written]
"""Writes one append alone: where it was written, or the error that refused it."""

_BACKSTOP_S = 0.1
"""The longest a waiting caller sleeps before it looks again: an interrupt can cut the writer's
wake-up loop short, leaving some callers unwoken."""


class AppendQueue:
    """The appends of one store waiting to be written, and whether a thread is writing.

    Interrupts (KeyboardInterrupt, or whatever a signal handler raises) land where a Python
    function starts, after a C call returns, at a loop's jump back, or in a blocking wait,
    anywhere here, so: the lock is an RLock taken and let go in C by `with` (`Condition`'s own
    `wait` can raise with its lock let go: cpython#118433, and its `_release_save` window);
    a waiting caller holds nothing while it waits, on a lock of its own (a gate) that the
    writer releases; `_writing` is set in the statement that takes the group and cleared first
    thing after the write; one `try` covers everything from queueing to the end of the write;
    an interrupted caller's append is marked abandoned first thing, and no writer takes one up;
    waits look again after `_BACKSTOP_S`; and an append that a double interrupt left neither
    queued nor decided, with no one writing, is queued again by its own caller, as a retry.
    tests/store/test_group_commit_interrupts.py interrupts each of these places in turn.
    """

    def __init__(self, write_group: WriteGroup, write_one: WriteOne) -> None:
        self._write_group = write_group
        self._write_one = write_one
        self._holders = threading.local()
        """`depth`: how many of the queue's write sections this thread is inside; an append
        made inside one (by a projection, a signal handler, or in `holding_writer`) goes alone."""
        self._fresh()
        _queues.add(self)

    def _fresh(self) -> None:
        """A new lock and an empty queue, no one writing (also in a forked child: its parent's
        threads, one of which may have been writing at the fork, do not exist in it; the
        forking thread, the only one there, keeps its `_holders`)."""
        self._lock = threading.RLock()
        """Guards `_queued`, `_writing` and `_gates`."""
        self._queued: list[QueuedAppend] = []
        self._writing = False
        self._gates: list[LockType] = []
        """The waiting callers' gates, each taken by its caller: the writer releases them."""

    def append(self, prepared: Sequence[PreparedAppend]) -> list[RecordedEvent]:
        """Write `prepared`, with whatever else is queued when no one is writing."""
        holders = self._holders
        if getattr(holders, "depth", 0):
            # This thread holds the store's write transaction (`holding_writer`), is writing a
            # group (a projection appending), or is waiting here (a signal handler appending):
            # the append goes alone, never waiting for this queue: on SQLite it is refused at
            # once if this thread is writing (no nesting), else waits for the writer lock.
            return self._write_one(prepared).events()
        holders.depth = 1
        try:
            written = self._write_if_idle(prepared)
            if written is None:
                mine = QueuedAppend(prepared)
                self._queue_and_write(mine)
                written = mine.outcome()
        finally:
            holders.depth = 0
        return written.events()  # built here, by its caller: `trm_store.written`

    def _write_if_idle(self, prepared: Sequence[PreparedAppend]) -> Written | None:
        """`prepared` written at once, alone, when no one is writing or waiting (the usual
        case, which so builds no `QueuedAppend` and no group); None, nothing done, else."""
        writing = False
        try:
            with self._lock:
                if self._writing or self._queued:
                    return None
                writing = self._writing = True  # no check for interrupts between
            # Assigned, not returned: the place right after the call stays inside the `try`.
            written = self._write_one(prepared)
        finally:
            if writing:
                self._writing = False  # first: nothing that an interrupt can cut comes before
                self._wake_waiting()
        return written

    def _queue_and_write(self, mine: QueuedAppend) -> None:
        """Queue `mine` and wait until it is decided or no one is writing, and in that case
        write every queued append, `mine` among them."""
        lock = self._lock
        group: list[QueuedAppend] = []
        writing = False
        try:
            with lock:
                self._queued.append(mine)
            while not writing:
                with lock:
                    if mine.decided:
                        return
                    if not self._writing:
                        if mine not in self._queued:  # taken by a writer, lost: see the class
                            mine.prepared = _as_retry(mine.prepared)
                            self._queued.append(mine)
                        group = [q for q in self._queued if not q.abandoned]
                        self._queued = []
                        writing = self._writing = True  # no check for interrupts between
                        break
                    gate = allocate_lock()
                    gate.acquire()
                    self._gates.append(gate)
                gate.acquire(True, _BACKSTOP_S)
            self._write_group(group)
        except BaseException:
            mine.abandoned = True  # first: nothing that checks for interrupts comes before
            # Interrupted: `mine` ends with it and is never written later. Whether a group this
            # thread was writing committed is unknown: its other appends go back to the queue
            # as retries, which the next writer either records or finds recorded (their ids
            # were fixed when they were prepared: exactly-once).
            undecided = [q for q in group if not q.decided and not q.abandoned]
            for queued in undecided:
                queued.prepared = _as_retry(queued.prepared)
            with lock:
                if mine in self._queued:
                    self._queued.remove(mine)
                self._queued[:0] = undecided
            raise
        finally:
            if writing:
                self._writing = False  # first: nothing that an interrupt can cut comes before
                self._wake_waiting()

    def _wake_waiting(self) -> None:
        """Release every waiting caller's gate (the writer is done: `_writing` is False)."""
        with self._lock:
            gates, self._gates = self._gates, []
        for gate in gates:
            gate.release()

    @contextmanager
    def holding_writer(self, transaction: AbstractContextManager[T]) -> Iterator[T]:
        """`transaction` (the store's write transaction), this thread marked as holding it."""
        self._holders.depth = getattr(self._holders, "depth", 0) + 1
        try:
            with transaction as held:
                yield held
        finally:
            self._holders.depth -= 1


def _as_retry(prepared: Sequence[PreparedAppend]) -> list[PreparedAppend]:
    """`prepared` marked as a possible retry: a write of it may have committed."""
    return [replace(item, ids_given=True) for item in prepared]


_queues: weakref.WeakSet[AppendQueue] = weakref.WeakSet()
"""Every store's queue in this process, made fresh in a forked child before any of its threads
runs (two threads each finding the queue stale would each replace it, losing what the other
queued)."""


def _fresh_queues_in_child() -> None:
    for queue in list(_queues):
        queue._fresh()


os.register_at_fork(after_in_child=_fresh_queues_in_child)
