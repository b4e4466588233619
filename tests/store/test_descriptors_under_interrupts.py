"""A descriptor the store keeps (the writer lock's `-writer` file, the WAL that
`durability="full"` syncs) is forgotten before it is closed: wherever an interrupt lands as it
is let go, the store never names a closed number, which the next open of any file may reuse.
Found by review: an interrupt right after the close left the number named; reused, the next
write took and let go another file's `flock`, or synced the `-shm` instead of the WAL."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import pytest

import trm_store.sqlite_writer_lock
import trm_store.wal_sync
from tests.store.helpers import TOTALS, added
from tests.store.interrupt_places import InterruptAt, Interrupted
from trm_store import open_store
from trm_store.backend import Durability


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


@pytest.mark.parametrize(
    ("durability", "keeper", "forget", "suffix", "module"),
    [
        ("normal", "_writer_lock", "_forget_file", "-writer", trm_store.sqlite_writer_lock),
        ("full", "_wal_sync", "_forget_fd", "-wal", trm_store.wal_sync),
    ],
    ids=["writer-lock", "wal-sync"],
)
def test_a_kept_descriptor_is_never_named_once_closed(
    sqlite_url: str, durability: Durability, keeper: str, forget: str, suffix: str, module: Any
) -> None:
    """The descriptor let go at each place in turn; after each, it names its file or nothing.
    Each round's append opens it again (the lock's file, or the WAL for its sync)."""
    path = sqlite_url.removeprefix("sqlite:///") + suffix
    with open_store(sqlite_url, projections=TOTALS, durability=durability) as store:
        kept = getattr(store._backend, keeper)

        def let_go() -> None:
            store.append("s", [added(1)])
            getattr(kept, forget)()

        places = _at_each_place(
            module.__file__, let_go, lambda: _names_its_file_or_nothing(kept._fd, path)
        )
        assert places > 3
