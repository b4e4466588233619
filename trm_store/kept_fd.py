"""Descriptors kept open between writes (the writer lock's `-writer` file, the WAL that
`durability="full"` syncs): each closed when its keeper lets it go, or is collected.

An interrupt (a KeyboardInterrupt, or whatever a signal handler raises) lands where Python code
starts, after a call returns or at a loop's jump back. A descriptor opened first and given its
finalizer after (`weakref.finalize` is Python code) could be lost to one landing in between:
open for good, named nowhere. So the finalizer is made first, over an empty list, and the
descriptor is opened into that list in C (`list.extend` over a `map` that calls `os.open`:
nothing checks for interrupts between the open and the append). Letting it go, it is taken out
of the list and closed in C too (`finalize.__call__` would drop the finalizer, then call Python
code). An interrupt anywhere else leaves it with the finalizer: open at worst until its keeper
is collected.

What a signal handler raises passes through, an `OSError` (a `TimeoutError` from an alarm's
handler) included: only the open's own failure is `CannotOpen` (`trm_store.handler_raised`
tells them apart).
"""

from __future__ import annotations

import os
import weakref
from collections import deque
from contextlib import suppress
from itertools import repeat

from trm_store.handler_raised import raised_by_a_handler

__all__ = ["CannotOpen", "close_kept", "open_kept"]


class CannotOpen(Exception):
    """The file could not be opened: `error` says why. Not an OSError, so that a caller that
    goes on without the file catches this and not what a signal handler raised."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _close_each(fds: list[int]) -> None:
    """Take each descriptor out of `fds` and close it, both in C: none closed and still named,
    none taken out and left open, wherever an interrupt lands. Another thread may empty it
    meanwhile (the finalizer run at interpreter exit as its keeper lets it go): the one that
    took each descriptor closed it."""
    with suppress(IndexError):
        deque(map(os.close, map(list.pop, repeat(fds, len(fds)))), maxlen=0)


def open_kept(
    keeper: object, path: str, flags: int, *, at_exit: bool = True
) -> tuple[int, weakref.finalize[[list[int]], object]]:
    """`os.open(path, flags, 0o644)`, and its finalizer, which `close_kept` calls to let it
    go, and which closes it otherwise when `keeper` is collected (and at interpreter exit,
    unless not `at_exit`). CannotOpen if the open fails, nothing left behind."""
    fds: list[int] = []
    close = weakref.finalize(keeper, _close_each, fds)
    close.atexit = at_exit
    try:
        fds.extend(map(os.open, (path,), (flags,), (0o644,)))
    except OSError as e:
        if fds:  # opened, then a signal handler raised: the finalizer keeps it
            raise
        close.detach()  # nothing opened: each failure would otherwise keep one registered
        if raised_by_a_handler(e):  # as the open waited
            raise
        raise CannotOpen(e) from e
    return fds[0], close


def close_kept(close: weakref.finalize[[list[int]], object]) -> None:
    """Close the descriptor `close` keeps (from `open_kept`), now, then drop the finalizer (an
    interrupt before that leaves one over an empty list, harmless). A failed close (EBADF: it
    was closed already, by someone else) has nothing left to do."""
    found = close.peek()
    if found is None:
        return  # closed already
    try:
        _close_each(found[2][0])
    except OSError as e:
        if raised_by_a_handler(e):
            raise
    close.detach()
