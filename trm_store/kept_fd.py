"""Descriptors kept open between writes (the writer lock's `-writer` file, the WAL that
`durability="full"` syncs): each closed when its keeper lets it go, or is collected.

An interrupt (a KeyboardInterrupt, or whatever a signal handler raises) lands where Python code
starts, after a call returns or at a loop's jump back. A descriptor opened first and given its
finalizer after (`weakref.finalize` is Python code) could be lost to one landing in between:
open for good, named nowhere. So the finalizer is made first, over an empty list, and the
descriptor is opened into that list in C (`list.extend` over a `map` that calls `os.open`:
nothing checks for interrupts between the open and the append). From then on the finalizer
holds it: an interrupt before its keeper names it leaves it open only until the keeper is
collected.
"""

from __future__ import annotations

import os
import weakref

__all__ = ["open_kept"]


def _close_each(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def open_kept(
    keeper: object, path: str, flags: int, *, at_exit: bool = True
) -> tuple[int, weakref.finalize[[list[int]], object]]:
    """`os.open(path, flags, 0o644)`, and what closes it: the finalizer its keeper calls to let
    it go (once: a second call does nothing), called otherwise when `keeper` is collected (and
    at interpreter exit, unless not `at_exit`). OSError as `os.open` raises it, nothing left
    behind."""
    fds: list[int] = []
    close = weakref.finalize(keeper, _close_each, fds)
    close.atexit = at_exit
    try:
        fds.extend(map(os.open, (path,), (flags,), (0o644,)))
    except OSError:  # the open failed (an interrupt may have opened it: it is left to `close`)
        close.detach()  # each failed open would otherwise keep a finalizer registered
        raise
    return fds[0], close
