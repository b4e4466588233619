"""What a signal handler raised, told apart from what a system call raised.

A signal's handler runs where CPython next checks for pending calls, right after a system call
returns for one, and what it raises comes out there. It may be an `OSError`: an alarm's handler
that raises `TimeoutError()` is the usual way to put a deadline on blocking code (the `signal`
module's documentation does it). Code that catches a system call's `OSError` (a file that
cannot be opened, a sync that failed) must not take that for the file's or the disk's failure,
nor a store's writer for one of its appends' errors: it is an interrupt, as KeyboardInterrupt
is, and passes through. A system call's own error carries its `errno`; one that Python code
raised without it (`TimeoutError()`, `InterruptedError()`) has none.
"""

from __future__ import annotations

__all__ = ["raised_by_a_handler"]


def raised_by_a_handler(error: BaseException) -> bool:
    """Whether `error` is an interrupt that no system call raised: an `OSError` without errno
    (what an exception that is no `Exception`, KeyboardInterrupt, already is to every
    `except Exception`)."""
    return isinstance(error, OSError) and error.errno is None
