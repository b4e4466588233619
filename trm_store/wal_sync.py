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
again). Every write transaction that ends waits for a sync, one that failed or wrote nothing
too: an append that finds its events recorded already (a retry), or that a stream's version
refuses, may rest on another process's commit that is not synced yet, and a block may have
committed before it raised.

A failed `fdatasync` raises StoreError in every write waiting for it, each told that what it
committed is visible; the store then refuses to write (as PostgreSQL stops at a failed fsync):
after a failed sync Linux may mark the pages it could not write clean, so a later sync that
succeeds proves nothing about them, and a frame lost from the middle of the WAL ends SQLite's
recovery there, dropping every commit after it. Only this store stops: another process, or the
store opened again, writes on (its descriptor never saw the error), so the disk and the file
want checking (the system's log, `PRAGMA integrity_check`) before anything writes to it again.
A WAL that cannot be opened for a sync fails the write that wanted it, with the same words,
and not the store: no page was lost.

The WAL is kept open from the time a connection is set up, before any commit on it: Linux
reports a write-back error to each open descriptor once, but to a descriptor opened after
another one (SQLite's own, syncing in a checkpoint that drops the error) has seen it, never. It
is found where SQLite keeps it (`PRAGMA database_list` names the file SQLite opened, beside
which it keeps `-wal`), and opened again only once SQLite has deleted it (when the last
connection to the file closes, after copying every frame into the database and syncing it):
the descriptor follows the file, as SQLite's does, if its directory is renamed.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import threading
import weakref

from trm_store.errors import StoreError
from trm_store.handler_raised import raised_by_a_handler
from trm_store.kept_fd import CannotOpen, close_kept, open_kept

__all__ = ["WAL_SYNCED", "WalSync"]

WAL_SYNCED = "trm_wal_synced"
"""The key, in a writer connection's `info`, marking that its commits are synced after the lock
(a store at `durability="full"` in WAL mode) instead of by SQLite."""

_datasync = getattr(os, "fdatasync", os.fsync)
"""What SQLite's FULL calls on the WAL: `fdatasync` where there is one, else `fsync`."""


class WalSync:
    """One store's syncs of its SQLite file's WAL, shared by its writers: numbered as they
    begin, so a write knows whether one covers its commit.

    One plain lock, taken with `with` (acquired and released in C), guards everything and is
    held through a sync: a write that finds its commit covered by a sync ended meanwhile
    returns, else it syncs. An interrupt anywhere leaves at worst a sync not counted, which the
    next write makes again; nothing waits for a notification that could be lost.
    """

    def __init__(self, describe: str) -> None:
        self._describe = describe
        self._path: str | None = None
        self._fd: int | None = None
        self._close_fd: weakref.finalize[[list[int]], object] | None = None
        self.failed: StoreError | None = None
        """The first failed sync's error: the store writes no more (the module says why)."""
        self._fresh()
        _syncs.add(self)

    def _fresh(self) -> None:
        """A new lock, no sync running (also in a forked child: a parent's thread that was
        syncing at the fork does not exist there)."""
        self._lock = threading.Lock()
        self._begun = 0
        self._ended = 0

    def watch(self, cursor: sqlite3.Cursor) -> bool:
        """Keep the WAL of `cursor`'s database open, for the commits of its connection (opened
        now unless the one kept is still SQLite's): whether it is. False (no descriptor left,
        say): the connection keeps SQLite's own FULL, since a descriptor opened after its
        commit could miss an error another one saw."""
        files = {name: path for _seq, name, path in cursor.execute("PRAGMA database_list")}
        # A read makes SQLite open the WAL, and create it if it is not there yet (a new file,
        # or one whose last connection closed): it is then the file this connection writes.
        cursor.execute("SELECT count(*) FROM sqlite_master").fetchone()
        with self._lock:
            self._path = f"{files['main']}-wal"
            try:
                self._keep_open()
            except CannotOpen:
                return False
        return True

    def sync(self) -> None:
        """Return once a sync that began after this call was made has ended: what a write that
        has just ended waits for."""
        number = self._begun + 1  # read once: it only grows, and a later one would do too
        with self._lock:
            if self._ended >= number:
                return
            if (failed := self.failed) is not None:
                raise StoreError(str(failed)) from failed.__cause__
            self._begun += 1
            this = self._begun
            try:
                # Kept as it is: SQLite deletes a WAL only once every connection to the file
                # has closed, the committing one too, and the next one's `watch` opens anew
                # (an `fstat` here, to look, cost ~40 us a sync, measured).
                fd = self._fd if self._fd is not None else self._keep_open()
            except CannotOpen as e:
                raise self._failure(e.error, "opening") from e.error
            try:
                _datasync(fd)
            except OSError as e:
                if raised_by_a_handler(e):  # as the sync waited: not the disk's failure
                    raise  # (the sync is not counted: the next write makes it again)
                if e.errno == errno.EBADF:  # the descriptor closed under us: no page lost
                    self._forget_fd()
                    raise self._failure(e, "reaching") from e
                self.failed = self._failure(e, "syncing")
                raise self.failed from e
            self._ended = this

    def _keep_open(self) -> int:
        """The WAL's descriptor, opened again if SQLite has deleted the file it names."""
        fd = self._fd
        if fd is not None:
            try:
                if os.fstat(fd).st_nlink > 0:
                    return fd
            except OSError as e:  # a descriptor closed under us: opened again, as deleted
                if raised_by_a_handler(e):
                    raise
        self._forget_fd()
        if self._path is None:
            missing = FileNotFoundError("no connection of the store has opened the database")
            raise CannotOpen(missing)
        # Not closed at exit: a daemon thread may still be syncing on it.
        fd, self._close_fd = open_kept(self, self._path, os.O_RDONLY | os.O_CLOEXEC, at_exit=False)
        self._fd = fd
        return fd

    def _forget_fd(self) -> None:
        # Forgotten before it is closed: a number closed but still named here could be reused
        # by another file (the `-shm`), which the next sync would sync instead of the WAL.
        close_fd, self._close_fd = self._close_fd, None
        self._fd = None
        if close_fd is not None:
            close_kept(close_fd)

    def _failure(self, error: OSError, doing: str) -> StoreError:
        after = "; the store writes no more until it is opened again" if doing == "syncing" else ""
        return StoreError(
            f"a write to {self._describe} ended, but {doing} its write-ahead log failed "
            f"({error.strerror or error}): whatever it committed is visible to readers, but may "
            f"be lost if the machine stops{after}"
        )


_syncs: weakref.WeakSet[WalSync] = weakref.WeakSet()


def _fresh_in_child() -> None:
    """Each store's syncs made fresh, and the parent's descriptor closed: it is the parent's
    open file, whose record of the write-back errors already reported the child would share
    (an error the child's sync met, the parent's would not meet again). The child's
    connections open their own."""
    for sync in list(_syncs):
        sync._fresh()
        sync._forget_fd()


os.register_at_fork(after_in_child=_fresh_in_child)
