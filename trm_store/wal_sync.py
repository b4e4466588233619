"""`durability="full"` on SQLite: commits synced to disk after the writer lock is let go.

SQLite's `synchronous=FULL` syncs the WAL inside `COMMIT`, while the committing connection holds
the database's write lock, so every other writer, of this process or another, waits for the disk
too: 150-300 us a commit on this project's hosts, a third of what four processes appending 50
events each spent under the lock (bench/README, "Twenty-sixth session"). trm's writer
connections commit at `synchronous=NORMAL` instead (the frames written, not synced), and a write
returns only once a sync of the WAL (`fdatasync`, the call FULL makes) that began after its
commit has ended: a write that returns is on disk, as at FULL, while the next writer, of another
process, is already writing. One sync covers every frame written before it began: the writes
that committed while one ran all wait for the next, which one of them makes.

The threads of one process still wait for it in turn: an append waits inside its group's write
(`trm_store.append_queue`), so the appends that queue meanwhile make the next group. Letting the
next group write while the last one waited for its sync made the groups smaller, and threads
no faster (bench/README, "Twenty-sixth session").

What differs from FULL: a commit is visible to readers up to one sync before its writer returns.
If the machine stops in between, that commit is lost (its writer was never told it succeeded),
together with whatever was committed after it and not synced yet; what was synced stays, and the
database stays consistent (NORMAL keeps a WAL consistent across power loss: each frame carries a
checksum of everything before it, and SQLite syncs the WAL's header itself when it starts the log
again). An append that finds its events recorded already (a retry) waits for a sync too: the
write that recorded them may not have had its own.

A failed sync raises StoreError in every write waiting for it, each told it is committed and
visible; the store then refuses to write (as PostgreSQL stops at a failed fsync): after a failed
sync Linux may mark the pages it could not write clean, so a later sync that succeeds proves
nothing about them, and a frame lost from the middle of the WAL ends SQLite's recovery there,
dropping every commit after it. Reopening the store, once the disk is checked, writes again.

The WAL is opened by its path for each sync, found where SQLite keeps it (`PRAGMA database_list`
names the file SQLite opened, beside which it keeps `-wal`): a descriptor kept open could name a
WAL that SQLite has since deleted (when the last connection to the file closes, after copying
every frame into the database and syncing it) and made anew. No WAL at all means just that:
every commit is in the synced database.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref

from trm_store.errors import StoreError

__all__ = ["WAL_SYNCED", "WalSync", "wal_path"]

WAL_SYNCED = "trm_wal_synced"
"""The key, in a writer connection's `info`, marking that its commits are synced after the lock
(a store at `durability="full"` in WAL mode) instead of by SQLite."""

_datasync = getattr(os, "fdatasync", os.fsync)
"""What SQLite's FULL calls on the WAL: `fdatasync` where there is one, else `fsync`."""


class WalSync:
    """One store's syncs of its SQLite file's WAL, shared by its writers: numbered as they
    begin, so a write knows which one covers its commit."""

    def __init__(self, describe: str) -> None:
        self._describe = describe
        self.path: str | None = None
        """The WAL's path, set by the first connection that commits this way (`wal_path`)."""
        self.failed: StoreError | None = None
        """The first failed sync's error: the store writes no more (the module says why)."""
        self._fresh()
        _syncs.add(self)

    def _fresh(self) -> None:
        """No sync running (also in a forked child: a parent's thread that was syncing at the
        fork does not exist there)."""
        self._changed = threading.Condition(threading.Lock())
        self._begun = 0
        self._ended = 0
        self._running = False

    def sync(self) -> None:
        """Return once a sync that began after this call was made has ended: what a write that
        has just committed (or found its events recorded) waits for."""
        changed = self._changed
        with changed:
            number = self._begun + 1
            while True:
                if (failed := self.failed) is not None:
                    raise StoreError(str(failed)) from failed.__cause__
                if self._ended >= number:
                    return
                if not self._running:
                    break
                changed.wait()
            self._running = True
            self._begun += 1
            this = self._begun
        try:
            self._sync()
        except BaseException as e:
            with changed:
                self._running = False
                if isinstance(e, StoreError):
                    self.failed = e
                changed.notify_all()
            raise
        with changed:
            self._running = False
            self._ended = this
            changed.notify_all()

    def _sync(self) -> None:
        path = self.path
        if path is None:  # nothing committed this way yet
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return  # deleted by SQLite, every frame copied to the synced database first
        except OSError as e:
            raise self._failure(e) from e
        try:
            _datasync(fd)
        except OSError as e:
            raise self._failure(e) from e
        finally:
            os.close(fd)

    def _failure(self, error: OSError) -> StoreError:
        return StoreError(
            f"a write to {self._describe} was committed, but syncing its write-ahead log "
            f"failed ({error.strerror or error}): readers see it, but it may be lost if the "
            "machine stops; the store writes no more until it is opened again"
        )


def wal_path(cursor: sqlite3.Cursor) -> str:
    """The WAL of the database `cursor`'s connection has open as its main one."""
    files = {name: path for _seq, name, path in cursor.execute("PRAGMA database_list")}
    return f"{files['main']}-wal"


_syncs: weakref.WeakSet[WalSync] = weakref.WeakSet()


def _fresh_in_child() -> None:
    for sync in list(_syncs):
        sync._fresh()


os.register_at_fork(after_in_child=_fresh_in_child)
