"""Group commit: appends that threads of one process make to one store at once are written
together, in one transaction.

Each append queues here, then waits until it is decided or no one is writing. A thread that finds
no one writing takes every queued append, its own and those queued while the last write ran, and
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
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import TypeVar

from trm_store.errors import StoreError
from trm_store.events import RecordedEvent
from trm_store.prepare import PreparedAppend

__all__ = ["AppendQueue", "QueuedAppend"]

T = TypeVar("T")


@dataclass(slots=True, eq=False)
class QueuedAppend:
    """One caller's append, and once written its outcome: the recorded events or the error."""

    prepared: Sequence[PreparedAppend]
    recorded: list[RecordedEvent] | None = None
    error: Exception | None = None

    @property
    def decided(self) -> bool:
        return self.recorded is not None or self.error is not None


WriteGroup = Callable[[list[QueuedAppend]], None]
"""Writes a group and decides every append in it; only a BaseException that is no Exception
(an interrupt) leaves some undecided."""


class AppendQueue:
    """The appends of one store waiting to be written, and whether a thread is writing."""

    def __init__(self, write_group: WriteGroup) -> None:
        self._write_group = write_group
        self._fresh()
        _queues.add(self)

    def _fresh(self) -> None:
        """A new lock and an empty queue, no one writing (also in a forked child: its parent's
        threads, one of which may have been writing at the fork, do not exist in it)."""
        self._changed = threading.Condition(threading.Lock())
        """Guards `_queued` and `_writing`; notified when a writer is done."""
        self._queued: list[QueuedAppend] = []
        self._writing = False
        self._holders = threading.local()

    def append(self, prepared: Sequence[PreparedAppend]) -> list[RecordedEvent]:
        """Write `prepared`, with whatever else is queued when no one is writing."""
        mine = QueuedAppend(prepared)
        if getattr(self._holders, "depth", 0):
            # This thread holds the store's write transaction (`holding_writer`), or is writing
            # a group (a projection or a signal handler appending): the append goes alone, to
            # the same immediate refusal as before (no nesting), and never waits for a writer
            # that is this thread or that waits for this thread's transaction.
            self._write_group([mine])
        else:
            group: list[QueuedAppend] = []
            try:
                with self._changed:
                    self._queued.append(mine)
                    try:
                        while self._writing and not mine.decided:
                            self._changed.wait()
                    except BaseException:
                        # Interrupted while it waited: an append still queued was written by
                        # nobody, and must not be by the next writer, after its caller was told
                        # it was interrupted.
                        if mine in self._queued:
                            self._queued.remove(mine)
                        raise
                    if not mine.decided:  # no one writing, `mine` still queued: write them all
                        group, self._queued = self._queued, []
                        self._writing = True
                if group:
                    self._write_queued(group, mine)
            finally:
                if group:  # this thread wrote: the next one may, and the decided ones return
                    with self._changed:
                        self._writing = False
                        self._changed.notify_all()
        if mine.error is not None:
            raise mine.error
        if mine.recorded is None:
            raise StoreError("an append was left undecided: nothing of it was written")
        return mine.recorded

    def _write_queued(self, group: list[QueuedAppend], mine: QueuedAppend) -> None:
        self._holders.depth = getattr(self._holders, "depth", 0) + 1
        try:
            self._write_group(group)
        except BaseException:
            # Interrupted (the caller's KeyboardInterrupt): whether the group committed is
            # unknown. The other callers' appends go back to the queue as retries, which the
            # next writer either records or finds recorded (their ids were fixed when they were
            # prepared: exactly-once). This caller's own append ends with its interrupt.
            undecided = [q for q in group if q is not mine and not q.decided]
            for queued in undecided:
                queued.prepared = [replace(item, ids_given=True) for item in queued.prepared]
            with self._changed:
                self._queued[:0] = undecided
            raise
        finally:
            self._holders.depth -= 1

    @contextmanager
    def holding_writer(self, transaction: AbstractContextManager[T]) -> Iterator[T]:
        """`transaction` (the store's write transaction), this thread marked as holding it."""
        self._holders.depth = getattr(self._holders, "depth", 0) + 1
        try:
            with transaction as held:
                yield held
        finally:
            self._holders.depth -= 1


_queues: weakref.WeakSet[AppendQueue] = weakref.WeakSet()
"""Every store's queue in this process, made fresh in a forked child before any of its threads
runs (two threads each finding the queue stale would each replace it, losing what the other
queued)."""


def _fresh_queues_in_child() -> None:
    for queue in list(_queues):
        queue._fresh()


os.register_at_fork(after_in_child=_fresh_queues_in_child)
