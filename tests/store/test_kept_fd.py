"""Descriptors kept open between writes (`trm_store.kept_fd`): never lost to an interrupt as
they are opened or let go, and what a signal handler raises meanwhile, an `OSError` included
(an alarm's `TimeoutError`), passes through instead of being taken for the file's or the
disk's failure. Found by review: a `TimeoutError` right after the open detached the finalizer
(the descriptor open for good) and the writer lock swallowed it; one as the descriptor was let
go lost it; one during the WAL's sync marked the store's disk as failed."""

from __future__ import annotations

import errno
import gc
import os
from pathlib import Path

import pytest

import trm_store.kept_fd
from tests.store.helpers import TOTALS, added, open_on
from tests.store.interrupt_places import InterruptAt, Interrupted, raised_after, traced_by
from trm_store import open_store
from trm_store.kept_fd import CannotOpen, close_kept, open_kept

_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC


class _Keeper:
    """What keeps a descriptor (a store's writer lock, its WAL's syncs)."""


@pytest.mark.parametrize("raised", [TimeoutError("alarm"), Interrupted("Ctrl-C")])
def test_what_is_raised_right_after_the_open_passes_through_and_loses_nothing(
    tmp_path: Path, raised: BaseException
) -> None:
    """Raised once the descriptor is in the finalizer's list: it passes through as it is, and
    the descriptor is closed once its keeper is collected."""
    keeper, path = _Keeper(), tmp_path / "kept"
    with raised_after("extend", "open_kept", raised), pytest.raises(type(raised)) as got:
        open_kept(keeper, str(path), _FLAGS)
    assert got.value is raised
    assert open_on(str(path)) == 1  # named by nothing but its finalizer
    raised.__traceback__ = None  # its frames hold the keeper
    del keeper, got
    gc.collect()
    assert open_on(str(path)) == 0


def test_the_open_s_own_failure_is_cannot_open(tmp_path: Path) -> None:
    with pytest.raises(CannotOpen) as got:
        open_kept(_Keeper(), str(tmp_path / "no such directory" / "kept"), _FLAGS)
    assert got.value.error.errno == errno.ENOENT


def test_an_interrupt_as_it_is_let_go_never_loses_it(tmp_path: Path) -> None:
    """`close_kept` interrupted at each place in turn: the descriptor is closed, or its
    finalizer still holds it (closed once its keeper is collected)."""
    path = tmp_path / "kept"
    for at in range(1, 50):
        keeper = _Keeper()
        _fd, close = open_kept(keeper, str(path), _FLAGS)
        tracer = InterruptAt(at, traced={trm_store.kept_fd.__file__}, own_starts=True)
        with traced_by(tracer):
            close_kept(close)
        del keeper, close
        gc.collect()
        assert open_on(str(path)) == 0, f"interrupted at {tracer.where}: the descriptor was lost"
        if tracer.places < at:
            assert at > 3
            return
    pytest.fail("the runs never reached the end")


def test_a_timeout_raised_as_the_writer_lock_opens_its_file_reaches_the_caller(
    sqlite_url: str,
) -> None:
    """The append that opens the `-writer` file gets the handler's TimeoutError, not a write
    that went on without the lock; nothing stays open once the store is closed and gone."""
    path = Path(sqlite_url.removeprefix("sqlite:///") + "-writer")
    store = open_store(sqlite_url, projections=TOTALS)
    store._backend._writer_lock._forget_file()  # type: ignore[attr-defined]  # opened again
    with raised_after("extend", "open_kept", TimeoutError("alarm")), pytest.raises(TimeoutError):
        store.append("s", [added(1)])
    assert store.head_position() == 0
    store.append("s", [added(2)])  # the next write takes the lock and writes
    assert store.head_position() == 1
    store.close()
    del store
    gc.collect()
    assert open_on(str(path)) == 0


def test_a_timeout_raised_as_the_wal_is_synced_is_not_a_failed_disk(sqlite_url: str) -> None:
    """At `durability="full"`, a handler's TimeoutError as the WAL's sync waits reaches the
    caller; the store is not marked as failed, and the next write syncs and returns."""
    with open_store(sqlite_url, projections=TOTALS, durability="full") as store:
        store.append("s", [added(1)])
        with raised_after("fdatasync", "sync", TimeoutError("alarm")), pytest.raises(TimeoutError):
            store.append("s", [added(2)])
        store.append("s", [added(3)])
        assert [e.data["amount"] for e in store.read_stream("s")] == [1, 2, 3]
