"""Writers never starve readers (issue 14 point 1), on SQLite and on PostgreSQL.

Many threads that write, and stay alive, must leave reads and further writes free: no call
waits for a connection held by a writer that is not writing. A thread's writer connection goes
when the thread does, not when some later thread happens to write. Every thread here is a
daemon joined with a timeout, and the scenarios run in a child process killed if it hangs: a
regression fails within a minute instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.store.helpers import ROOT, TOTALS, added, totals
from trm_store import Store, open_store
from trm_store.sqlite import SqliteBackend

CALL_LIMIT = 1.0
"""Seconds any one read may take (a starved one waits 30 s for the pool, then fails)."""
WRITE_LIMIT = 20.0
"""Seconds an append may take: it waits for the write lock, behind up to a hundred others here
(on PostgreSQL, behind every store of the database: the append lock is the database's), so the
lock's throughput bounds it, on a loaded machine seconds; a starved one waits 30 s and fails."""
JOIN_LIMIT = 60.0
"""Seconds a group of threads may take to do what they were started for."""
CHILD_LIMIT = 240.0
"""Seconds a scenario's child process may take in all."""

Call = tuple[str, float, str | None]
"""What was called, how long it took (s), the error it raised if any."""


def time_call(calls: list[Call], what: str, call: Callable[[], object]) -> None:
    """Run `call`, noting in `calls` what it was, how long it took and the error if any."""
    started = time.perf_counter()
    try:
        call()
    except Exception as e:  # noted, then reported by the test
        calls.append((what, time.perf_counter() - started, repr(e)))
    else:
        calls.append((what, time.perf_counter() - started, None))


def reads(store: Store) -> Callable[[], object]:
    """One round of the store's reads: the log's head, a stream, the log, a projection."""

    def read() -> None:
        store.head_position()
        store.read_stream("w0")
        list(store.read_all(batch_size=50))
        totals(store)

    return read


def start(target: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def join(threads: list[threading.Thread]) -> None:
    deadline = time.monotonic() + JOIN_LIMIT
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    alive = sum(t.is_alive() for t in threads)
    assert alive == 0, f"{alive} of {len(threads)} threads still running after {JOIN_LIMIT} s"


def wait_all(events: list[threading.Event]) -> None:
    deadline = time.monotonic() + JOIN_LIMIT
    waiting = [e for e in events if not e.wait(max(0.0, deadline - time.monotonic()))]
    assert not waiting, f"{len(waiting)} of {len(events)} threads never got there"


def live_writers(store: Store, calls: list[Call]) -> None:
    """100 threads append and stay alive; then reads and writes, from old and new threads; then
    the writers end and reads again."""
    appended, release = [threading.Event() for _ in range(100)], threading.Event()

    def writer(n: int) -> None:
        time_call(calls, "append (writer thread)", lambda: store.append(f"w{n}", [added(n)]))
        appended[n].set()
        release.wait(2 * JOIN_LIMIT)  # alive, its connection unused, until the test lets go

    def new_thread(what: str, call: Callable[[], object]) -> None:
        join([start(lambda: time_call(calls, what, call))])

    writers = [start(lambda n=n: writer(n)) for n in range(100)]  # type: ignore[misc]
    wait_all(appended)
    time_call(calls, "read, writers alive", reads(store))
    time_call(calls, "append, writers alive", lambda: store.append("main", [added(1)]))
    new_thread("new thread's append", lambda: store.append("x", [added(1)]))
    release.set()
    join(writers)
    time_call(calls, "read, writers gone", reads(store))
    new_thread("new thread's read", reads(store))
    assert store.head_position() == 102
    assert totals(store) == {f"w{n}": (n, 1) for n in range(100)} | {"main": (1, 1), "x": (1, 1)}


def queued_writers(store: Store, calls: list[Call]) -> None:
    """One thread holds a write transaction open while 30 others try to append."""
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with store.write_transaction():
            held.set()
            release.wait(JOIN_LIMIT)

    def queued(n: int) -> None:
        time_call(calls, "queued append", lambda: store.append(f"w{n}", [added(n)]))

    holding = start(holder)
    wait_all([held])
    writers = [start(lambda n=n: queued(n)) for n in range(30)]  # type: ignore[misc]
    time.sleep(1.5)  # the writers queue up; the reader threads keep reading
    time_call(calls, "read, writers queued", reads(store))
    assert store.head_position() == 0
    release.set()
    join([holding, *writers])
    assert store.head_position() == 30


SCENARIOS: dict[str, Callable[[Store, list[Call]], None]] = {
    "live_writers": live_writers,
    "queued_writers": queued_writers,
}


def child(scenario: str, url: str) -> None:
    """In the child process: the scenario on a store at `url`, with three threads reading in a
    loop all along; every call printed as JSON. Exits at once, whatever threads still hang (the
    store is closed only on success: closing waits for them)."""
    code = 1
    try:
        store = open_store(url, projections=TOTALS)
        calls: list[Call] = []
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                time_call(calls, "read (reader thread)", reads(store))

        readers = [start(loop) for _ in range(3)]
        SCENARIOS[scenario](store, calls)
        stop.set()
        join(readers)
        print(json.dumps(calls), flush=True)
        store.close()
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_writers_never_starve_readers(store_url: str, scenario: str) -> None:
    """Each scenario runs in a child process, killed if it hangs: today's code must not wait
    for connections that a regression would hold (30 s each, one after another)."""
    command = [sys.executable, "-m", "tests.store.test_writer_starvation", scenario, store_url]
    try:
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=CHILD_LIMIT
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{scenario} still running after {CHILD_LIMIT} s: {e.stderr!r:.2000}")
    assert done.returncode == 0, done.stderr[-3000:]
    calls = [tuple(c) for c in json.loads(done.stdout.splitlines()[-1])]
    failed = [c for c in calls if c[2] is not None]
    assert not failed, f"{len(failed)} of {len(calls)} calls failed, e.g. {failed[:3]}"
    slow = [c for c in calls if c[1] > (WRITE_LIMIT if "append" in c[0] else CALL_LIMIT)]
    assert not slow, f"{len(slow)} of {len(calls)} calls took too long: {slow[:5]}"
    assert {"read, writers alive", "read, writers queued"} & {c[0] for c in calls}


# -- SQLite: a writer connection lives as long as its thread, and no longer ----------------------
# (Counting the process's file descriptors would not tell: SQLite keeps a closed connection's
# descriptor while another connection holds a lock on the file, to reuse it.)


def raw_writer(store: Store) -> sqlite3.Connection | None:
    """This thread's writer connection, as the driver's connection; None when the thread has
    none (its appends were written by other threads', with theirs: `trm_store.append_queue`)."""
    backend = store._backend
    assert isinstance(backend, SqliteBackend)
    conn = getattr(backend._writers._mine, "conn", None)
    if conn is None or conn.closed:
        return None
    raw = conn.connection.dbapi_connection
    assert isinstance(raw, sqlite3.Connection)
    return raw


def is_closed(raw: sqlite3.Connection) -> bool:
    try:
        raw.execute("SELECT 1")
    except sqlite3.ProgrammingError:  # "Cannot operate on a closed database."
        return True
    return False


def test_closing_the_store_under_live_writer_threads(sqlite_url: str) -> None:
    """close() closes every connection, the live threads' too; a thread's next append opens a
    new one, closed in turn when the thread ends."""
    store = open_store(sqlite_url, projections=TOTALS)
    first: dict[int, sqlite3.Connection] = {}
    second: dict[int, sqlite3.Connection] = {}
    appended, again = [threading.Event() for _ in range(10)], threading.Event()

    def writer(n: int) -> None:
        store.append(f"w{n}", [added(n)])
        if (raw := raw_writer(store)) is not None:
            first[n] = raw
        appended[n].set()
        again.wait(JOIN_LIMIT)
        store.append(f"w{n}", [added(n)])
        if (raw := raw_writer(store)) is not None:
            second[n] = raw

    writers = [start(lambda n=n: writer(n)) for n in range(10)]  # type: ignore[misc]
    wait_all(appended)
    store.close()
    assert all(is_closed(raw) for raw in first.values())
    again.set()
    join(writers)
    assert first and second
    assert all(is_closed(raw) for raw in second.values())
    assert not {id(r) for r in first.values()} & {id(r) for r in second.values()}
    assert totals(store) == {f"w{n}": (2 * n, 2) for n in range(10)}
    store.close()


def test_a_thread_pool_keeps_one_connection_per_worker_outside_the_readers_pool(
    sqlite_url: str,
) -> None:
    """Workers that live as long as their pool each keep one connection, none of the readers'
    pool's; they close when the pool shuts down."""
    with open_store(sqlite_url, projections=TOTALS) as store:
        seen: dict[int, sqlite3.Connection] = {}

        def append(n: int) -> None:
            store.append(f"s{n % 7}", [added(1)])
            raw = raw_writer(store)
            if raw is not None:
                seen[id(raw)] = raw

        with ThreadPoolExecutor(max_workers=8) as pool:
            for result in [pool.submit(append, n) for n in range(400)]:
                result.result(JOIN_LIMIT)
            assert 1 <= len(seen) <= 8
            assert not any(is_closed(raw) for raw in seen.values())
            engine = store._backend.engine
            assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
            assert store.head_position() == 400
        assert all(is_closed(raw) for raw in seen.values())


if __name__ == "__main__":
    child(*sys.argv[1:])
