"""The writers of one SQLite file in one process queue on a lock of the process, not in SQLite.

SQLite lets one writer at a time into a database; `BEGIN IMMEDIATE` makes the others wait in its
busy handler, which polls: it sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100 ms between tries
(`sqliteDefaultBusyCallback`). A writer queued behind a 3 ms transaction sleeps well past its
end, and a writer that arrives later may take the database in between: four threads appending
50 events each got fewer events/s than one thread (bench/writers_bench.py). Threads of one process
wait on a lock of this process instead, per database file, which hands the database to the next
writer as soon as the last one commits. Writers of other processes still meet the busy handler.

The lock is re-entrant: a thread that writes to a second store on the same file while its first
write transaction is open waits in SQLite's busy handler and fails after its timeout, as it did
before, instead of deadlocking on itself. A forked child gets fresh locks: a parent's thread that
held one at the fork does not exist in the child, and would hold it there forever.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from weakref import WeakValueDictionary

from trm_store.errors import StoreError

__all__ = ["ProcessWriterLock", "process_writer_lock"]


class ProcessWriterLock:
    """One database file's write lock in this process: held from `BEGIN IMMEDIATE` to the end of
    the transaction, by at most one thread."""

    __slots__ = ("__weakref__", "_lock", "_timeout", "_where")

    def __init__(self, where: str, timeout: float) -> None:
        self._lock = threading.RLock()
        self._timeout = timeout
        self._where = where

    def acquire(self) -> None:
        """Wait for the lock as long as SQLite's busy timeout would have: StoreError after."""
        if not self._lock.acquire(timeout=self._timeout):
            raise StoreError(
                f"sqlite:///{self._where} stayed locked past the busy timeout: another thread "
                "of this process held its write transaction open"
            )

    def release(self) -> None:
        self._lock.release()


_locks: WeakValueDictionary[str, ProcessWriterLock] = WeakValueDictionary()
"""Every open store's lock by database file: stores on one file in one process share it."""
_locks_lock = threading.Lock()


def process_writer_lock(path: Path, timeout: float) -> ProcessWriterLock:
    """The lock of the database at `path` in this process (kept alive by the stores using it)."""
    key = str(path.resolve())
    with _locks_lock:
        lock = _locks.get(key)
        if lock is None:
            lock = _locks[key] = ProcessWriterLock(key, timeout)
        return lock


def _fresh_locks_in_child() -> None:
    global _locks_lock
    _locks_lock = threading.Lock()
    for lock in list(_locks.values()):
        lock._lock = threading.RLock()


os.register_at_fork(after_in_child=_fresh_locks_in_child)
