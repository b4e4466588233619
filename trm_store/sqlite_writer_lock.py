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
  on the machine: a waiting process tries it again after sleeping a quarter of what it has
  waited so far (at least 20 us, at most 10 ms), instead of in steps of up to 100 ms. The
  kernel drops it when its holder dies (SIGKILL included).

Both are held from `BEGIN IMMEDIATE` to the end of the transaction and waited for at most the
busy timeout. Neither is what keeps writers apart: `BEGIN IMMEDIATE` still does that, so a
writer that takes neither (another program, sqlite3's shell) is as safe as before, and a store
whose `-writer` file cannot be opened (a read-only directory) works without it.

The lock is re-entrant: a thread that writes to a second store on the same file while its first
write transaction is open waits in SQLite's busy handler and fails after its timeout, as it did
before, instead of deadlocking on itself. A forked child gets fresh locks and its own descriptor:
a parent's thread that held one at the fork does not exist in the child, and a `flock` belongs
to the open file, which an inherited descriptor shares with the parent.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
import weakref
from pathlib import Path
from weakref import WeakValueDictionary

from trm_store.errors import StoreError

__all__ = ["WriterLock", "writer_lock"]

_SHORTEST_RETRY_S = 0.00002
_LONGEST_RETRY_S = 0.01
_RETRY_FRACTION = 0.25
"""A process waiting for another's write transaction tries the file lock again after sleeping
`_RETRY_FRACTION` of what it has waited, within these bounds: a wait ends at most a quarter
later than the lock was free (plus the shortest sleep), at a cost of a few tries per doubling of
the wait. Transactions take ~0.3-2 ms: with steps of 0.1 ms growing to 1 ms (before), a waiter
often slept past the end of the transaction it waited for, and four processes appending to one
file got 0.87-0.91x of eventsourcing's events/s, against 0.99-1.01x with short steps
(bench/writers_bench.py's workload, 7 rounds)."""


class WriterLock:
    """One database file's write lock, for the threads of this process and across processes:
    held from `BEGIN IMMEDIATE` to the end of the transaction, by at most one thread."""

    __slots__ = ("__weakref__", "_close_fd", "_depth", "_fd", "_lock", "_timeout", "_where")

    def __init__(self, where: str, timeout: float) -> None:
        self._lock = threading.RLock()
        self._timeout = timeout
        self._where = where
        self._fd: int | None = None
        self._close_fd: weakref.finalize[[int], WriterLock] | None = None
        self._depth = 0
        """How many times this thread holds `_lock` (the file lock is taken at the first)."""

    def acquire(self) -> None:
        """Wait for the lock as long as SQLite's busy timeout would have: StoreError after."""
        deadline = time.monotonic() + self._timeout
        if not self._lock.acquire(timeout=self._timeout):
            raise StoreError(
                f"sqlite:///{self._where} stayed locked past the busy timeout: another thread "
                "of this process held its write transaction open"
            )
        try:
            if self._depth == 0:
                self._lock_file(deadline)
        except BaseException:
            self._lock.release()
            raise
        self._depth += 1

    def release(self) -> None:
        self._depth -= 1
        try:
            if self._depth == 0 and self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._lock.release()

    def _lock_file(self, deadline: float) -> None:
        if self._fd is None:
            try:
                self._fd = os.open(
                    f"{self._where}-writer", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
                )
            except OSError:
                return  # SQLite's busy handler alone queues the processes, as it did before
            self._close_fd = weakref.finalize(self, os.close, self._fd)
        started = time.monotonic()
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                now = time.monotonic()
                if now >= deadline:
                    raise StoreError(
                        f"sqlite:///{self._where} stayed locked past the busy timeout: another "
                        "process held its write transaction open"
                    ) from None
                pause = max((now - started) * _RETRY_FRACTION, _SHORTEST_RETRY_S)
                time.sleep(min(pause, _LONGEST_RETRY_S, deadline - now))

    def close_file(self) -> None:
        """Close the lock's file unless a thread of this process holds the lock (a store is
        closing); the next write opens it again."""
        if self._lock.acquire(blocking=False):
            try:
                if self._depth == 0:
                    self._forget_file()
            finally:
                self._lock.release()

    def forget_after_fork(self) -> None:
        """In a forked child: a fresh lock, and a descriptor of its own when it next writes
        (closing the inherited one leaves the parent's `flock` alone: the parent's descriptor
        still holds it)."""
        self._lock = threading.RLock()
        self._depth = 0
        self._forget_file()

    def _forget_file(self) -> None:
        if self._close_fd is not None:
            self._close_fd()
        self._fd = self._close_fd = None


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


os.register_at_fork(after_in_child=_fresh_locks_in_child)
