"""The SQLite writer lock across processes (`trm_store.sqlite_writer_lock`): trm processes queue
on a `flock` beside the database instead of in SQLite's polling busy handler; a dead holder
frees it, a forked child never shares its parent's, and a store works without it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

import trm_store.sqlite
from tests.store.helpers import ROOT, TOTALS, added, in_a_forked_child, totals
from trm_store import Store, StoreError, open_store
from trm_store.sqlite import SqliteBackend
from trm_store.sqlite_writer_lock import WriterLock

HOLD = """
import sys, time
from tests.store.helpers import TOTALS
from trm_store import open_store
with open_store(sys.argv[1], projections=TOTALS) as store, store.write_transaction():
    print("held", flush=True)
    time.sleep(120)
"""


def lock_of(store: Store) -> WriterLock:
    backend = store._backend
    assert isinstance(backend, SqliteBackend)
    return backend._writer_lock


@contextmanager
def held_by_another_process(url: str) -> Iterator[subprocess.Popen[str]]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, url], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield holder
    finally:
        holder.kill()
        holder.wait(30)


@contextmanager
def short_timeout(lock: WriterLock, seconds: float) -> Iterator[None]:
    saved, lock._timeout = lock._timeout, seconds
    try:
        yield
    finally:
        lock._timeout = saved


def test_a_writer_waits_for_another_process_on_the_file_lock(sqlite_url: str) -> None:
    """Past the (shortened) timeout the message names the other process: the wait was on the
    file lock, not in SQLite's busy handler (60 s, and another message)."""
    with open_store(sqlite_url, projections=TOTALS) as store:
        store.append("s", [added(1)])
        with held_by_another_process(sqlite_url), short_timeout(lock_of(store), 0.3):
            started = time.monotonic()
            with pytest.raises(StoreError, match="another process held its write transaction"):
                store.append("s", [added(2)])
            assert time.monotonic() - started < 10
        assert store.stream_version("s") == 1


def test_a_killed_holder_frees_the_lock(sqlite_url: str) -> None:
    with open_store(sqlite_url, projections=TOTALS) as store:
        with held_by_another_process(sqlite_url) as holder:
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(30)
            with short_timeout(lock_of(store), 10):
                store.append("s", [added(1)])
        assert store.stream_version("s") == 1


def test_a_forked_child_does_not_share_its_parent_s_file_lock(sqlite_url: str) -> None:
    """A `flock` belongs to the open file: a child writing through the descriptor it inherited
    would take the lock its parent holds."""
    with open_store(sqlite_url, projections=TOTALS) as store:
        store.append("s", [added(1)])  # the lock's file is open
        with store.write_transaction():
            said = in_a_forked_child(lambda: take_within(lock_of(store), 0.3))
        assert said == b"waited for another process"
        store.append("s", [added(2)])
        assert store.stream_version("s") == 2


class _Holder:
    """A write transaction, as the lock sees one: still open."""

    ended = False


def take_within(lock: WriterLock, seconds: float) -> bytes:
    """In a forked child: what taking its store's lock came to."""
    lock._timeout = seconds
    try:
        lock.acquire(_Holder())
    except StoreError as e:
        return b"waited for another process" if "another process" in str(e) else b"other error"
    return b"taken"


def test_a_store_whose_lock_file_cannot_be_opened_still_writes(sqlite_url: str) -> None:
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    Path(f"{path}-writer").mkdir()  # where the lock's file would go
    with open_store(sqlite_url, projections=TOTALS) as store:
        store.append("s", [added(1)])
        with store.write_transaction():
            pass
        assert store.stream_version("s") == 1


def test_closing_the_store_closes_the_lock_s_file(sqlite_url: str) -> None:
    """A closed store kept alive holds no descriptor of `<file>-writer`; a write reopens it."""
    writer_file = Path(sqlite_url.removeprefix("sqlite:///") + "-writer").resolve()

    def open_on_it() -> int:
        fds = Path("/proc/self/fd")
        return sum(1 for fd in fds.iterdir() if _target(fd) == writer_file)

    store = open_store(sqlite_url, projections=TOTALS)
    store.append("s", [added(1)])
    assert open_on_it() == 1
    store.close()
    assert open_on_it() == 0
    store.append("s", [added(2)])
    assert open_on_it() == 1
    store.close()


def _target(fd: Path) -> Path | None:
    try:
        return Path(os.readlink(fd))
    except OSError:
        return None


TAKE = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print("taken")
        break
    except BlockingIOError:
        time.sleep(0.01)
else:
    print("still held")
"""


def taken_by_another_process(url: str, within: float = 10.0) -> str:
    """Whether another process can take the file lock within `within` seconds (never hangs)."""
    writer_file = url.removeprefix("sqlite:///") + "-writer"
    done = subprocess.run(
        [sys.executable, "-c", TAKE, writer_file, str(within)],
        capture_output=True,
        text=True,
        timeout=within + 30,
    )
    return done.stdout.strip()


def test_a_wait_given_up_lets_the_lock_go_and_the_next_wait_gets_it(sqlite_url: str) -> None:
    """A wait past the timeout goes on in the kernel: when it gets the lock it must let it go
    at once (or every other process would wait for this one forever), and the process's next
    write waits again, on the same thread."""
    with open_store(sqlite_url, projections=TOTALS) as store:
        store.append("s", [added(1)])
        lock = lock_of(store)
        with held_by_another_process(sqlite_url) as holder:
            with short_timeout(lock, 0.2), pytest.raises(StoreError, match="another process"):
                store.append("s", [added(2)])
            wait = lock._wait
            assert wait is not None  # the kernel wait, still waiting
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(30)
        assert taken_by_another_process(sqlite_url) == "taken"
        with held_by_another_process(sqlite_url) as holder:
            threading.Timer(0.3, os.kill, (holder.pid, signal.SIGKILL)).start()
            with short_timeout(lock, 30):
                store.append("s", [added(3)])  # waits in the kernel until the holder dies
        assert lock._wait is wait
        assert store.stream_version("s") == 2 and totals(store) == {"s": (4, 2)}
        assert taken_by_another_process(sqlite_url) == "taken"  # and let it go after


def test_closing_the_store_ends_its_wait_thread_and_descriptor(sqlite_url: str) -> None:
    writer_file = Path(sqlite_url.removeprefix("sqlite:///") + "-writer").resolve()
    store = open_store(sqlite_url, projections=TOTALS)
    with held_by_another_process(sqlite_url) as holder:
        threading.Timer(0.2, os.kill, (holder.pid, signal.SIGKILL)).start()
        with short_timeout(lock_of(store), 30):
            store.append("s", [added(1)])
    assert _open_on(writer_file) == 2  # the store's own and its wait's
    store.close()
    deadline = time.monotonic() + 10
    while _open_on(writer_file) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _open_on(writer_file) == 0
    assert not [t for t in threading.enumerate() if t.name == "trm-flock-wait"]


def test_a_forked_child_closes_its_copy_of_a_wait_s_descriptor(sqlite_url: str) -> None:
    """A lock held through an open file goes only when every descriptor of it is closed: a
    child's copy of the parent's wait descriptor would keep the lock after the parent died."""
    writer_file = Path(sqlite_url.removeprefix("sqlite:///") + "-writer").resolve()
    with open_store(sqlite_url, projections=TOTALS) as store:
        with held_by_another_process(sqlite_url) as holder:
            threading.Timer(0.2, os.kill, (holder.pid, signal.SIGKILL)).start()
            with short_timeout(lock_of(store), 30):
                store.append("s", [added(1)])
        assert _open_on(writer_file) == 2
        said = in_a_forked_child(lambda: str(_open_on(writer_file)).encode())
        assert said == b"0"


def _open_on(path: Path) -> int:
    """This process's descriptors open on `path`."""
    return sum(1 for fd in Path("/proc/self/fd").iterdir() if _target(fd) == path)


def test_a_writer_interrupted_while_it_waits_leaves_the_lock_to_the_others(
    sqlite_url: str,
) -> None:
    """Ctrl-C while an append waits for another process: when that process lets the lock go,
    this one's wait must not take it for nobody (every other process would then wait out its
    busy timeout)."""
    with open_store(sqlite_url, projections=TOTALS) as store:
        store.append("s", [added(1)])
        with held_by_another_process(sqlite_url) as holder:

            def interrupt(*_: object) -> None:
                raise KeyboardInterrupt

            previous = signal.signal(signal.SIGALRM, interrupt)
            try:
                signal.setitimer(signal.ITIMER_REAL, 0.3)
                with pytest.raises(KeyboardInterrupt):
                    store.append("s", [added(2)])
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(30)
        assert taken_by_another_process(sqlite_url) == "taken"
        store.append("s", [added(3)])
        assert totals(store) == {"s": (4, 2)}


def test_a_store_closed_while_its_writer_waits_closes_the_file_after(sqlite_url: str) -> None:
    writer_file = Path(sqlite_url.removeprefix("sqlite:///") + "-writer").resolve()
    store = open_store(sqlite_url, projections=TOTALS)
    store.append("s", [added(1)])
    outcome: list[BaseException | None] = []

    def write() -> None:
        try:
            store.append("s", [added(2)])
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    with held_by_another_process(sqlite_url) as holder:
        writer = threading.Thread(target=write)
        with short_timeout(lock_of(store), 30):
            writer.start()
            time.sleep(0.3)  # waiting in the kernel now
            store.close()
            os.kill(holder.pid, signal.SIGKILL)
            writer.join(30)
    assert len(outcome) == 1  # it ended, one way or the other
    deadline = time.monotonic() + 10
    while _open_on(writer_file) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _open_on(writer_file) == 0
    assert not [t for t in threading.enumerate() if t.name == "trm-flock-wait"]


def test_without_a_thread_to_wait_a_writer_waits_in_sqlite_s_busy_handler(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At interpreter shutdown (3.12) no thread can start: the writer goes on without the file
    lock, queued by SQLite's busy handler, as before the file lock existed."""

    def no_thread(path: str) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    with open_store(sqlite_url, projections=TOTALS) as store:
        store.append("s", [added(1)])
        monkeypatch.setattr("trm_store.sqlite_writer_lock.FlockWait", no_thread)
        with held_by_another_process(sqlite_url) as holder:
            threading.Timer(0.3, os.kill, (holder.pid, signal.SIGKILL)).start()
            store.append("s", [added(2)])
        assert totals(store) == {"s": (3, 2)}


def test_an_interrupt_just_after_begin_immediate_leaves_no_transaction_open(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt that lands once `BEGIN IMMEDIATE` has taken SQLite's write lock, before the
    append's transaction is set up (here: from a statement listener, where a signal's handler
    could run): the transaction is rolled back with the writer lock let go. Found by review:
    the connection kept SQLite's lock, and another thread's append waited out the busy timeout
    and failed."""
    monkeypatch.setattr(trm_store.sqlite, "BUSY_TIMEOUT_MS", 2000)
    with open_store(sqlite_url, projections=TOTALS) as store:
        armed = [True]

        def interrupt_after_begin(*args: Any) -> None:
            if armed[0] and args[2] == "BEGIN IMMEDIATE":
                armed[0] = False
                raise KeyboardInterrupt

        event.listen(store._backend.engine, "after_cursor_execute", interrupt_after_begin)
        with pytest.raises(KeyboardInterrupt):
            store.append("interrupted", [added(1)])
        other: list[object] = []
        thread = threading.Thread(
            target=lambda: other.append(store.append("other", [added(2)])), daemon=True
        )
        thread.start()
        thread.join(30)
        assert other and isinstance(other[0], list), "the other thread's append failed"
        assert [e.stream_id for e in store.read_all()] == ["other"]


def test_canary_the_thread_lock_tells_whether_this_thread_holds_it() -> None:
    """The writer lock tells a hold an interrupt left behind by `RLock._is_owned()`, which
    CPython's `threading.Condition` uses and typeshed leaves out (`_ThreadLock` in
    `trm_store.sqlite_writer_lock`, its one user): owned by the thread that took it, by no
    other, and by none once let go."""
    lock = WriterLock("/nonexistent/trm-canary.db", 1.0)._lock
    assert not lock._is_owned()
    assert lock.acquire()
    seen: list[bool] = []
    other = threading.Thread(target=lambda: seen.append(lock._is_owned()))
    other.start()
    other.join()
    assert lock._is_owned() and seen == [False]
    lock.release()
    assert not lock._is_owned()
