"""The writers of one SQLite file queue on locks of their own, not in SQLite's busy handler.

SQLite lets one writer at a time into a database; `BEGIN IMMEDIATE` makes the others wait in its
busy handler, which polls: it sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100 ms between tries
(`sqliteDefaultBusyCallback`). A writer queued behind a 3 ms transaction sleeps well past its
end, and a writer that arrives later may take the database in between: four threads appending
50 events each got fewer events/s than one thread, and four processes half of what one process
got (bench/writers_bench.py). So a trm writer first takes, per database file:

- a lock of its process, which hands the database to the next thread as soon as the last one
  commits;
- then a `flock` on a file beside the database (`<file>-writer`), shared by every trm process
  on the machine. A process that finds it taken waits for it in the kernel (a blocking `flock`,
  on a thread of its own so that the wait can end at the busy timeout): the kernel wakes it
  when the holder unlocks, and waiters take it in turn, where polling with sleeps (SQLite's, or
  ours before) woke late and favoured whoever polled last. The kernel drops it when its holder
  dies (SIGKILL included).

Both are held from `BEGIN IMMEDIATE` to the end of the transaction and waited for at most the
busy timeout. Neither is what keeps writers apart: `BEGIN IMMEDIATE` still does that, so a
writer that takes neither (another program, sqlite3's shell) is as safe as before, and a store
whose `-writer` file cannot be opened (a read-only directory) works without it.

A thread that writes to a second store on the same file while its first write transaction is
open does not take it again: it waits in SQLite's busy handler and fails after its timeout, as
it did before, instead of deadlocking on itself. A forked child gets fresh locks and its own
descriptor: a parent's thread that held one at the fork does not exist in the child, and a
`flock` belongs to the open file, which an inherited descriptor shares with the parent.

Interrupts (a KeyboardInterrupt, or whatever a signal handler raises) can cut `acquire` or
`release` short between the steps the lock takes in C, and a signal handler may write in
between. So each thread names the transactions that take the lock (`_mine`) from before the
process's lock is taken until after it is let go; the hold is the last one's (one named before
it had not taken the lock: a signal handler's write came while it waited). A hold whose last
holder has `ended` was left behind by an interrupt, and `let_go_stale` lets it go, every
descriptor's `flock` with it (the transaction's own clean-up calls it as the interrupt goes by,
and `acquire` and a store's `close` on that thread call it too: `trm_store.sqlite_transaction`
says when each runs); one whose last holder has not ended is live, whatever step it is at, and
a write a signal handler makes meanwhile goes on without taking the lock again.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Protocol, cast
from weakref import WeakValueDictionary

from trm_store.errors import StoreError
from trm_store.flock_wait import FlockWait, forget_in_child
from trm_store.handler_raised import raised_by_a_handler
from trm_store.kept_fd import CannotOpen, close_kept, open_kept

__all__ = ["WriterLock", "writer_lock"]

_WRITER_FILE = "{}-writer"


class Holder(Protocol):
    """A write transaction, as the lock sees it: whether its `with` block is over (it may
    still hold the lock if an interrupt cut its release short)."""

    ended: bool


class _ThreadLock(Protocol):
    """`threading.RLock`, with what CPython's has and typeshed leaves out: whether this thread
    holds it (what tells a hold an interrupt left behind)."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool: ...
    def release(self) -> None: ...
    def _is_owned(self) -> bool: ...


def _thread_lock() -> _ThreadLock:
    return cast(_ThreadLock, threading.RLock())


class WriterLock:
    """One database file's write lock, for the threads of this process and across processes:
    held from `BEGIN IMMEDIATE` to the end of the transaction, by at most one thread."""

    __slots__ = (
        "__weakref__",
        "_close_fd",
        "_close_pending",
        "_fd",
        "_held",
        "_lock",
        "_mine",
        "_stop_wait",
        "_timeout",
        "_wait",
        "_where",
    )

    def __init__(self, where: str, timeout: float) -> None:
        self._lock = _thread_lock()
        self._timeout = timeout
        self._where = where
        self._fd: int | None = None
        self._close_fd: weakref.finalize[[list[int]], object] | None = None
        self._held: int | None = None
        """The descriptor that holds the file lock now: `_fd`, or `_wait`'s."""
        self._wait: FlockWait | None = None
        """Waits for the file lock in the kernel when it is taken (made at the first time)."""
        self._stop_wait: weakref.finalize[[], WriterLock] | None = None
        self._mine = threading.local()
        """`holders`: this thread's transactions that took the lock or are taking it, named
        before the process's lock is taken and forgotten after it is let go; several when a
        signal handler's write came while the one before it waited for the lock."""
        self._close_pending = False
        """A store closed while a thread held or waited for the lock: that thread closes."""

    def acquire(self, holder: Holder) -> None:
        """Wait for the lock as long as SQLite's busy timeout would have: StoreError after.
        Not taken if a live transaction of this thread holds it (a write to another store on
        the file, or one a signal handler interrupted: SQLite's busy handler then decides
        `holder`'s `BEGIN IMMEDIATE`); a hold of this thread's that an interrupt left behind is
        let go first."""
        lock, mine = self._lock, self._mine
        try:
            holders: list[Holder] = mine.holders
        except AttributeError:  # this thread's first write
            holders = mine.holders = []
        if lock._is_owned():
            if holders and not holders[-1].ended:  # the hold is its last holder's: live
                return
            self.let_go_stale()
        holders.append(holder)
        deadline = time.monotonic() + self._timeout
        if not lock.acquire(timeout=self._timeout):
            holders.remove(holder)
            raise StoreError(
                f"sqlite:///{self._where} stayed locked past the busy timeout: another thread "
                "of this process held its write transaction open"
            )
        try:
            self._lock_file(deadline)
        except BaseException:
            self.release(holder)
            raise

    def release(self, holder: Holder) -> None:
        """Let go, if `holder` took the lock (else a live transaction of this thread holds it:
        see `acquire`); `holder` forgotten only once the process's lock is let go."""
        holders: list[Holder] = self._mine.holders  # named by `acquire`
        if not holders or holders[-1] is not holder:
            return
        if (held := self._held) is not None:
            self._held = None
            if held == self._fd:
                fcntl.flock(held, fcntl.LOCK_UN)
            elif self._wait is not None:
                self._wait.give_back()
        self._let_go(last=True)
        holders.pop()

    def let_go_stale(self) -> None:
        """This thread's hold, if its last holder has ended (an interrupt cut `release` or
        `acquire` short) or none is named, let go: the file unlocked through each descriptor
        that may hold it (unlocking one that does not is harmless), then the process's lock.
        The hold is the last holder's: one named before it had not taken the lock (a signal
        handler's write came while it waited), or that one would not have been named. Holders
        that have ended are forgotten either way."""
        lock = self._lock
        holders: list[Holder] = getattr(self._mine, "holders", [])
        if lock._is_owned() and not (holders and not holders[-1].ended):
            self._held = None
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            if self._wait is not None:
                self._wait.give_back()
            self._let_go(last=True)
            while lock._is_owned():  # an interrupted `close_file` may have taken it once more
                lock.release()
        holders[:] = [h for h in holders if not h.ended]

    def _let_go(self, *, last: bool) -> None:
        """The process's lock, let go by the thread that holds it; the file closed first if a
        store closed meanwhile (`close_file`) and this is the `last` of the thread's hold."""
        try:
            if last and self._close_pending:
                self._close_pending = False
                self._forget_file()
        finally:
            self._lock.release()

    def _lock_file(self, deadline: float) -> None:
        if self._fd is None:
            try:
                self._fd, self._close_fd = open_kept(
                    self, _WRITER_FILE.format(self._where), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
                )
            except CannotOpen:
                return  # SQLite's busy handler alone queues the processes, as it did before
        # Named before it is taken: an interrupt as the lock is got still has it let go
        # (unlocking a descriptor that holds nothing is harmless).
        self._held = self._fd
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            self._held = None  # taken: wait for it
        except OSError as e:
            if raised_by_a_handler(e):  # the lock may be taken: `_held` has it let go
                raise
            self._held = None
            return  # no locks on this file system: SQLite's busy handler queues the processes
        if self._wait is None:
            try:
                self._wait = FlockWait(_WRITER_FILE.format(self._where))
            except (OSError, RuntimeError) as e:
                if raised_by_a_handler(e):
                    raise
                return  # no file, or no thread (interpreter shutdown): as without a file
            self._stop_wait = weakref.finalize(self, self._wait.close)
        self._held = self._wait.fd  # named before it is taken, as above
        if not self._wait.take(deadline - time.monotonic()):
            self._held = None
            raise StoreError(
                f"sqlite:///{self._where} stayed locked past the busy timeout: another "
                "process held its write transaction open"
            )

    def close_file(self) -> None:
        """Close the lock's file (a store is closing; the next write opens it again), now or,
        if a thread of this process holds or waits for the lock, when it lets it go."""
        self._close_pending = True
        if self._lock.acquire(blocking=False):
            self._let_go(last=not getattr(self._mine, "holders", None))

    def forget_after_fork(self) -> None:
        """In a forked child: a fresh lock, and a descriptor of its own when it next writes
        (closing the inherited one leaves the parent's `flock` alone: the parent's descriptor
        still holds it). The parent's wait is dropped, its thread absent here
        (`flock_wait.forget_in_child` closes its descriptor)."""
        self._lock = _thread_lock()
        self._mine = threading.local()
        self._close_pending = False
        if self._stop_wait is not None:
            self._stop_wait.detach()
        self._wait = self._stop_wait = None
        self._forget_file()

    def _forget_file(self) -> None:
        # Forgotten before it is closed: a number closed but still named here could be reused
        # by another file, whose `flock` the next write would take and let go.
        close_fd, self._close_fd = self._close_fd, None
        self._fd = self._held = None
        if close_fd is not None:
            close_kept(close_fd)
        if self._wait is not None and self._wait.close_if_idle():
            if self._stop_wait is not None:
                self._stop_wait.detach()
            self._wait = self._stop_wait = None


_locks: WeakValueDictionary[str, WriterLock] = WeakValueDictionary()
"""Every open store's lock by database file: stores on one file in one process share it."""
_locks_lock = threading.Lock()


def writer_lock(path: Path, timeout: float) -> WriterLock:
    """The lock of the database at `path` (kept alive by the stores using it)."""
    key = str(path.resolve())
    with _locks_lock:
        lock = _locks.get(key)
        if lock is None:
            lock = _locks[key] = WriterLock(key, timeout)
        return lock


def _fresh_locks_in_child() -> None:
    global _locks_lock
    _locks_lock = threading.Lock()
    for lock in list(_locks.values()):
        lock.forget_after_fork()
    forget_in_child()


os.register_at_fork(after_in_child=_fresh_locks_in_child)
