"""A descriptor the store keeps (the writer lock's `-writer` file, the WAL that
`durability="full"` syncs) is forgotten before it is closed: wherever an interrupt lands as it
is let go, the store never names a closed number, which the next open of any file may reuse.
And wherever one lands as it is opened, it is never lost: closed once the store is closed and
collected. Found by review: an interrupt right after the close left the number named; reused,
the next write took and let go another file's `flock`, or synced the `-shm` instead of the WAL;
an interrupt between the open and the making of its finalizer left it open for good."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from typing import Any

import pytest

import trm_store.kept_fd
import trm_store.sqlite_writer_lock
import trm_store.wal_sync
from tests.store.helpers import TOTALS, added, open_on
from tests.store.interrupt_places import InterruptAt, traced_by
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


_KEEPERS = pytest.mark.parametrize(
    ("durability", "keeper", "forget", "suffix", "module"),
    [
        ("normal", "_writer_lock", "_forget_file", "-writer", trm_store.sqlite_writer_lock),
        ("full", "_wal_sync", "_forget_fd", "-wal", trm_store.wal_sync),
    ],
    ids=["writer-lock", "wal-sync"],
)
"""Each kept descriptor: the durability that keeps it, its keeper in the backend, the keeper's
method that lets it go, its file's suffix, the keeper's module."""


def _at_each_place(
    traced: set[str], forget: Callable[[], object], check: Callable[[], bool], broken: str
) -> int:
    """`forget` interrupted at its 1st, 2nd, ... place in the `traced` files, one run each,
    `check` after each (`broken`: what it found if it fails); how many places there were."""
    for at in range(1, 100):
        tracer = InterruptAt(at, traced=traced, own_starts=True)
        with traced_by(tracer):
            forget()
        assert check(), f"interrupted at {tracer.where}: {broken}"
        if tracer.places < at:
            return at
    pytest.fail("the runs never reached the end")


@_KEEPERS
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
            {module.__file__},
            let_go,
            lambda: _names_its_file_or_nothing(kept._fd, path),
            "a closed or foreign descriptor named",
        )
        assert places > 3


@_KEEPERS
def test_a_kept_descriptor_is_never_lost_as_it_is_opened(
    sqlite_url: str, durability: Durability, keeper: str, forget: str, suffix: str, module: Any
) -> None:
    """The descriptor let go, then opened again by an append interrupted at each place in
    turn; after each, once the store is closed and collected, no descriptor of the process
    is open on the file."""
    path = sqlite_url.removeprefix("sqlite:///") + suffix
    traced = {module.__file__, trm_store.kept_fd.__file__}

    def reopened() -> None:
        store.append("s", [added(1)])

    def none_left() -> bool:
        nonlocal store, kept
        kept = None
        store.close()
        store = None
        gc.collect()
        left = open_on(path)
        store = open_store(sqlite_url, projections=TOTALS, durability=durability)
        store.append("s", [added(1)])  # the file is there, and the store writes
        kept = getattr(store._backend, keeper)
        getattr(kept, forget)()  # the next run's append opens it again
        return left == 0

    store: Any = open_store(sqlite_url, projections=TOTALS, durability=durability)
    store.append("s", [added(1)])
    kept: Any = getattr(store._backend, keeper)
    getattr(kept, forget)()
    try:
        assert _at_each_place(traced, reopened, none_left, "a descriptor left open") > 3
    finally:
        store.close()


@pytest.mark.parametrize(
    ("durability", "suffix", "module"),
    [("normal", "-writer", trm_store.sqlite_writer_lock), ("full", "-wal", trm_store.wal_sync)],
    ids=["writer-lock", "wal-sync"],
)
def test_a_kept_descriptor_is_never_lost_as_the_store_closes(
    sqlite_url: str, durability: Durability, suffix: str, module: Any
) -> None:
    """`store.close()` interrupted at each place in turn (in the keeper and in
    `trm_store.kept_fd`), then closed again, as a program that caught the interrupt would:
    once the store is collected, no descriptor is open on the file. Found by review:
    interrupted as `weakref.finalize` called its function, the descriptor was named by no one
    and closed by no one."""
    path = sqlite_url.removeprefix("sqlite:///") + suffix
    traced = {module.__file__, trm_store.kept_fd.__file__}
    store: Any = None

    def written() -> None:
        nonlocal store
        store = open_store(sqlite_url, projections=TOTALS, durability=durability)
        store.append("s", [added(1)])

    def closed_and_gone() -> bool:
        nonlocal store
        store.close()
        store = None
        gc.collect()
        left = open_on(path)
        written()
        return left == 0

    written()
    try:
        assert (
            _at_each_place(traced, lambda: store.close(), closed_and_gone, "a descriptor lost") > 3
        )
    finally:
        store.close()
