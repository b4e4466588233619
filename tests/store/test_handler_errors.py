"""What a signal handler raises on the write path, an `OSError` included (an alarm's handler
raising `TimeoutError()`, the usual deadline on blocking code), reaches the caller whose thread
it interrupted, as KeyboardInterrupt does: never taken for a file that cannot be opened, a file
system without locks, a failed sync or one append's own error, and never left holding a lock or
a connection. Each place is where CPython runs a pending handler: right after a C call returns
(`raised_after`). Found by review (second of the thirty-first session)."""

from __future__ import annotations

import fcntl
import gc
import os
import threading
import time
from collections.abc import Callable

import pytest

from tests.store.helpers import TOTALS, added, flock_free, open_on
from tests.store.interrupt_places import LIMIT, raised_after
from trm_store import RecordedEvent, Store, open_store
from trm_store.sqlite import SqliteBackend

_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC


def _backend(store: Store) -> SqliteBackend:
    backend = store._backend
    assert isinstance(backend, SqliteBackend)
    return backend


def test_a_timeout_as_the_writer_lock_is_taken_reaches_the_caller_and_lets_it_go(
    sqlite_url: str,
) -> None:
    """After the non-blocking `flock` took the lock: not 'no locks on this file system' (the
    lock then held for good, every other process waiting out its busy timeout)."""
    path = sqlite_url.removeprefix("sqlite:///") + "-writer"
    with open_store(sqlite_url, projections=TOTALS) as store:
        store.append("s", [added(1)])
        with (
            raised_after("flock", "_lock_file", TimeoutError("alarm")),
            pytest.raises(TimeoutError),
        ):
            store.append("s", [added(2)])
        assert flock_free(path)
        assert store.head_position() == 1
        store.append("s", [added(3)])
        assert store.head_position() == 2


def test_a_timeout_as_the_wait_for_another_process_s_lock_is_set_up_reaches_the_caller(
    sqlite_url: str,
) -> None:
    """Another process holds the lock; the wait's file opened, then the handler's error: the
    write does not go on without the lock."""
    path = sqlite_url.removeprefix("sqlite:///") + "-writer"
    store = open_store(sqlite_url, projections=TOTALS)
    store.append("s", [added(1)])
    other = os.open(path, _FLAGS)
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        with raised_after("open", "__init__", TimeoutError("alarm")), pytest.raises(TimeoutError):
            store.append("s", [added(2)])
    finally:
        fcntl.flock(other, fcntl.LOCK_UN)
        os.close(other)
    assert store.head_position() == 1
    store.append("s", [added(3)])
    store.close()


def test_a_timeout_as_the_wal_is_looked_at_reaches_the_caller_and_keeps_its_descriptor(
    sqlite_url: str,
) -> None:
    """`_keep_open` looks at the WAL it keeps (`fstat`) as a new writer connection is set up:
    the handler's error there is not a descriptor closed under it, which would close the WAL
    kept since before any commit and open it again (a new descriptor can miss a write-back
    error another one saw: `trm_store.wal_sync`)."""
    with open_store(sqlite_url, projections=TOTALS, durability="full") as store:
        sync = _backend(store)._wal_sync
        assert sync is not None
        store.append("s", [added(1)])
        kept = sync._close_fd
        reader = _backend(store).engine.connect()  # keeps the WAL there as the writers close
        try:
            _backend(store)._writers.close()  # this thread's next append sets up another
            with (
                raised_after("fstat", "_keep_open", TimeoutError("alarm")),
                pytest.raises(TimeoutError),
            ):
                store.append("s", [added(2)])
            assert sync._close_fd is kept
        finally:
            reader.close()
        store.append("s", [added(3)])
        assert [e.data["amount"] for e in store.read_stream("s")] == [1, 3]


def _queued_behind(
    store: Store, streams: list[Callable[[], list[RecordedEvent]]]
) -> tuple[list[threading.Thread], dict[int, object]]:
    """Each of `streams` appended by a thread of its own, all queued behind a writer that then
    finishes without waking them: this thread's next append writes them as its group."""
    queue = store._appends
    outcomes: dict[int, object] = {}

    def run(k: int) -> None:
        try:
            outcomes[k] = streams[k]()
        except BaseException as e:
            outcomes[k] = e

    with queue._lock:
        queue._writing = True
    threads = []
    for k in range(len(streams)):
        threads.append(threading.Thread(target=run, args=(k,)))
        threads[-1].start()
        deadline = time.monotonic() + LIMIT
        while len(queue._queued) < len(threads):
            assert time.monotonic() < deadline, "the appends never queued"
            time.sleep(0.001)
    with queue._lock:
        queue._writing = False  # not woken: they wait for the next writer, this thread
    return threads, outcomes


def test_a_timeout_in_a_group_s_sync_is_its_writer_s_and_the_others_are_written_once(
    sqlite_url: str,
) -> None:
    """The group committed, then its writer's sync got the handler's error: not 'one append
    may have caused it' (each written alone, the writer's own returned as written, the error
    lost). The writer gets it; the others are written exactly once and return."""
    with open_store(sqlite_url, projections=TOTALS, durability="full") as store:
        store.append("warm", [added(0)])
        threads, outcomes = _queued_behind(
            store, [lambda: store.append("a", [added(1)]), lambda: store.append("b", [added(2)])]
        )
        with raised_after("fdatasync", "sync", TimeoutError("alarm")), pytest.raises(TimeoutError):
            store.append("main", [added(9)])
        store._appends._wake_waiting()
        for thread in threads:
            thread.join(LIMIT)
        assert all(isinstance(outcomes[k], list) for k in (0, 1)), outcomes
        streams = [e.stream_id for e in store.read_all()]
        assert sorted(streams) == ["a", "b", "main", "warm"]  # the writer's own committed


def test_a_timeout_in_another_append_s_write_alone_is_the_writer_s_not_that_append_s(
    sqlite_url: str,
) -> None:
    """A group refused by an event id taken is written append by append, by its writer: the
    handler's error as one of those writes syncs is the writer's thread's, not that append's
    caller's (who would retry an append that was written)."""
    with open_store(sqlite_url, projections=TOTALS, durability="full") as store:
        (taken,) = store.append("owner", [added(0)])
        threads, outcomes = _queued_behind(
            store,
            [
                lambda: store.append("s1", [added(1)]),
                lambda: store.append("b", [added(4, event_id=taken.event_id)]),
            ],
        )
        with (
            raised_after("fdatasync", "sync", TimeoutError("alarm"), nth=2),
            pytest.raises(TimeoutError),
        ):
            store.append("main", [added(9)])
        store._appends._wake_waiting()
        for thread in threads:
            thread.join(LIMIT)
        assert isinstance(outcomes[0], list), outcomes
        assert [e.stream_id for e in store.read_all()].count("s1") == 1


@pytest.mark.parametrize("raised", [TimeoutError("alarm"), KeyboardInterrupt()], ids=repr)
def test_an_interrupt_in_a_projection_s_statement_leaves_no_invalidated_writer_connection(
    sqlite_url: str, raised: BaseException
) -> None:
    """SQLAlchemy invalidates a connection when an interrupt, or a `TimeoutError` (asyncio's,
    to it), comes out of its statement: the thread's next write opens another, with its
    `IN_USE` lock, not this one revalidated onto a connection of the readers' pool, and
    `store.close()` closes everything."""
    store = open_store(sqlite_url, projections=TOTALS)
    store.append("s", [added(1)])
    with raised_after("execute", "do_execute", raised), pytest.raises(type(raised)):
        store.append("s", [added(2)])
    store.append("s", [added(3)])
    writers = _backend(store)._writers
    conn = writers.mine()
    assert conn is not None and not conn.invalidated and "trm_in_use" in conn.info
    assert _backend(store).engine.pool.checkedout() == 0  # no reader's slot taken
    store.close()
    assert conn.closed
    path = sqlite_url.removeprefix("sqlite:///") + "-writer"
    del store
    gc.collect()
    assert open_on(path) == 0
