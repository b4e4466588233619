"""A descriptor the store keeps (the writer lock's `-writer` file, the WAL that
`durability="full"` syncs) is forgotten before it is closed: wherever an interrupt lands as it
is let go, the store never names a closed number, which the next open of any file may reuse.
Found by review: an interrupt right after the close left the number named; reused, the next
write took and let go another file's `flock`, or synced the `-shm` instead of the WAL."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest

import trm_store.sqlite_writer_lock
import trm_store.wal_sync
from tests.store.helpers import TOTALS, added
from tests.store.interrupt_places import InterruptAt, Interrupted
from trm_store import open_store


def _names_its_file_or_nothing(fd: int | None, path: str) -> bool:
    """`fd` is None, or open on the file at `path`."""
    if fd is None:
        return True
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False


def _at_each_place(traced: str, forget: Callable[[], object], check: Callable[[], bool]) -> int:
    """`forget` interrupted at its 1st, 2nd, ... place in the `traced` file, one run each,
    `check` after each; how many places there were."""
    for at in range(1, 100):
        tracer = InterruptAt(at, traced={traced}, own_starts=True)
        sys.settrace(tracer)
        try:
            forget()
        except Interrupted:
            pass
        finally:
            sys.settrace(None)
        assert check(), f"interrupted at {tracer.where}: a closed or foreign descriptor named"
        if tracer.places < at:
            return at
    pytest.fail("the runs never reached the end")


def test_the_writer_lock_never_names_a_closed_descriptor(sqlite_url: str) -> None:
    path = sqlite_url.removeprefix("sqlite:///")
    with open_store(sqlite_url, projections=TOTALS) as store:
        lock = store._backend._writer_lock  # type: ignore[attr-defined]

        def forget() -> None:
            store.append("s", [added(1)])  # opens the file again
            lock._forget_file()

        places = _at_each_place(
            trm_store.sqlite_writer_lock.__file__,
            forget,
            lambda: _names_its_file_or_nothing(lock._fd, f"{path}-writer"),
        )
        assert places > 3


def test_the_wal_sync_never_names_a_closed_descriptor(sqlite_url: str) -> None:
    path = sqlite_url.removeprefix("sqlite:///")
    with open_store(sqlite_url, projections=TOTALS, durability="full") as store:
        sync = store._backend._wal_sync  # type: ignore[attr-defined]

        def forget() -> None:
            store.append("s", [added(1)])  # its sync opens the WAL again
            sync._forget_fd()

        places = _at_each_place(
            trm_store.wal_sync.__file__,
            forget,
            lambda: _names_its_file_or_nothing(sync._fd, f"{path}-wal"),
        )
        assert places > 3
