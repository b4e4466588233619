"""Waiting for a file's `flock` in the kernel, up to a deadline.

A blocking `flock` has no timeout, and polling a non-blocking one with sleeps wakes late and
favours whoever polls last. So one thread per lock file and process waits in the kernel, on an
open file of its own, for the callers of its process (one at a time: `WriterLock` queues them);
a caller waits for that thread at most until its deadline. The kernel wakes the thread when the
holder unlocks, and waiting processes take the lock in turn. A wait that its caller gave up
unlocks the moment it gets the lock, unless another caller of the process wants it by then.
"""

from __future__ import annotations

import fcntl
import os
import threading
from contextlib import suppress

__all__ = ["FlockWait", "forget_in_child"]

_IDLE, _WANTED, _HELD, _CLOSED = "idle", "wanted", "held", "closed"


class FlockWait:
    """One process's waits for the `flock` of the file at `path`, on a thread of their own."""

    __slots__ = ("_changed", "_in_kernel", "_state", "fd")

    def __init__(self, path: str) -> None:
        """OSError if the file cannot be opened, RuntimeError if no thread can be started (at
        interpreter shutdown): the caller then goes without (SQLite's busy handler queues it)."""
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        """Its own open file: a lock it holds is nobody else's descriptor's."""
        _open.add(self.fd)
        self._state = _IDLE
        self._in_kernel = False
        """The thread is inside `flock`: it cannot be stopped before the lock is free."""
        self._changed = threading.Condition(threading.Lock())
        try:
            threading.Thread(target=self._run, name="trm-flock-wait", daemon=True).start()
        except BaseException:
            _open.discard(self.fd)
            os.close(self.fd)
            raise

    def take(self, timeout: float) -> bool:
        """Whether this process holds the lock now, through `fd` (False: not within `timeout`
        seconds; the lock is then let go as soon as the thread gets it)."""
        with self._changed:
            self._state = _WANTED
            self._changed.notify_all()
            got = False
            try:
                got = self._changed.wait_for(lambda: self._state == _HELD, max(timeout, 0.0))
            finally:
                if not got:  # timed out, or interrupted (KeyboardInterrupt): nobody takes it
                    if self._state == _HELD:
                        fcntl.flock(self.fd, fcntl.LOCK_UN)
                    self._state = _IDLE
            return got

    def give_back(self) -> None:
        """Unlock what `take` got."""
        with self._changed:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            self._state = _IDLE

    def close(self) -> None:
        """Stop the thread, which closes the descriptor (at once if it is not waiting for the
        lock, when its wait ends if it is)."""
        with self._changed:
            self._state = _CLOSED
            self._changed.notify_all()

    def close_if_idle(self) -> bool:
        """`close`, unless the thread is waiting in the kernel for a wait given up: kept then,
        for the next wait of the process (each store closed during one long hold would
        otherwise leave a thread and a descriptor behind until the lock is free)."""
        with self._changed:
            if self._in_kernel:
                return False
            self._state = _CLOSED
            self._changed.notify_all()
            return True

    def _run(self) -> None:
        try:
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self._state in (_WANTED, _CLOSED))
                    if self._state == _CLOSED:
                        return
                    self._in_kernel = True
                # An error (a file system without locks): the caller goes on without the lock,
                # and SQLite's busy handler queues it, as when the file cannot be opened.
                with suppress(OSError):
                    fcntl.flock(self.fd, fcntl.LOCK_EX)
                with self._changed:
                    self._in_kernel = False
                    if self._state == _WANTED:
                        self._state = _HELD
                        self._changed.notify_all()
                    else:  # given up, or closed, while it waited
                        fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            _open.discard(self.fd)
            os.close(self.fd)


_open: set[int] = set()
"""The descriptors of this process's waits."""


def forget_in_child() -> None:
    """In a forked child, where the parent's wait threads do not exist: close the inherited
    descriptors, without touching the waits' conditions (a parent's thread may have held one
    at the fork). A lock held through an open file goes only when every descriptor of it is
    closed: a copy left open here would keep the parent's lock held after the parent died."""
    for fd in list(_open):
        _open.discard(fd)
        with suppress(OSError):
            os.close(fd)
