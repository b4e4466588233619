"""The SQLite backend's per-thread writer connections: reused, outside the readers' pool, closed
when their thread ends, fork-safe, never nested."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from types import FrameType

import pytest
from pydantic import BaseModel
from sqlalchemy import Connection

import trm_store.writer_connections
from tests.store.helpers import in_a_forked_child
from tests.store.interrupt_places import LIMIT, InterruptAt, Interrupted, at_each_place, traced_by
from trm_store import NewEvent, Store, StoreError, open_store, register_event_type
from trm_store.sqlite import SqliteBackend
from trm_store.writer_connections import WriterConnections


class Ping(BaseModel):
    n: int


register_event_type("test.ping", Ping)


def ping(n: int) -> list[NewEvent]:
    return [NewEvent("test.ping", {"n": n})]


def writers(store: Store) -> WriterConnections:
    backend = store._backend
    assert isinstance(backend, SqliteBackend)
    return backend._writers


def mine(store: Store) -> Connection:
    """This thread's writer connection."""
    conn: Connection = writers(store)._mine.conn
    return conn


def test_a_thread_reuses_its_connection_across_appends(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store:
        store.append("s", ping(1))
        first = mine(store)
        store.append("s", ping(2))
        assert mine(store) is first
        assert first.connection.dbapi_connection is not None
        assert store._backend.engine.pool.checkedout() == 0  # detached: not the readers' slot
        assert [e.data["n"] for e in store.read_stream("s")] == [1, 2]


def test_a_thread_s_connection_is_closed_when_the_thread_ends(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store:
        store.append("main", ping(0))
        opened = []

        def work(n: int) -> None:
            store.append(f"t{n}", ping(n))
            opened.append(mine(store))

        for n in range(5):
            worker = threading.Thread(target=work, args=(n,))
            worker.start()
            worker.join()
            assert opened[-1].closed  # at once: no other thread had to write first
        assert writers(store)._open == {mine(store)}
        assert store.head_position() == 6


def test_threads_append_concurrently_each_on_its_own_connection(sqlite_url: str) -> None:
    """Each thread that writes does so on a connection of its own. Its appends may be written by
    another thread (group commit: whoever holds the turn writes every queued append, on its own
    connection), so each thread also opens a write transaction, which is never grouped."""
    with open_store(sqlite_url) as store:
        seen: dict[str, Connection] = {}
        start = threading.Barrier(4)

        def work(name: str) -> None:
            start.wait()
            for n in range(50):
                store.append(name, ping(n))
            with store.write_transaction():
                seen[name] = mine(store)

        threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({id(c) for c in seen.values()}) == 4
        assert store.head_position() == 200
        for name in seen:
            assert [e.version for e in store.read_stream(name)] == list(range(1, 51))


def test_nested_write_transactions_are_refused_and_the_outer_one_survives(
    sqlite_url: str,
) -> None:
    with open_store(sqlite_url) as store:
        with store.write_transaction(), pytest.raises(StoreError, match="do not nest"):
            store.append("s", ping(1))
        store.append("s", ping(2))
        assert [e.data["n"] for e in store.read_stream("s")] == [2]


@pytest.mark.parametrize("child_closes_first", [False, True])
def test_a_forked_child_opens_its_own_connection_and_the_parent_keeps_writing(
    sqlite_url: str, child_closes_first: bool
) -> None:
    with open_store(sqlite_url) as store:
        store.append("s", ping(1))
        parent_conn = mine(store)

        def child() -> bytes:  # append through the inherited store
            if child_closes_first:  # must leave the parent's connection alone
                store.close()
            store.append("s", ping(2))
            own = mine(store)
            return bytes([0 if own is not parent_conn and not parent_conn.closed else 2])

        child_code = in_a_forked_child(child)
        assert child_code == bytes([0])
        store.append("s", ping(3))
        assert mine(store) is parent_conn
        assert not parent_conn.closed
        assert [e.data["n"] for e in store.read_stream("s")] == [1, 2, 3]


def test_a_fork_leaves_the_connections_of_the_parent_s_other_threads_alone(
    sqlite_url: str,
) -> None:
    """A child drops the locals of the threads it did not inherit, leases included, before any
    fork hook runs: those leases must not close the parent's connections in the child."""
    with open_store(sqlite_url) as store:
        theirs: list[Connection] = []
        appended, release = threading.Event(), threading.Event()

        def worker() -> None:
            store.append("w", ping(1))
            theirs.append(mine(store))
            appended.set()
            release.wait(30)
            store.append("w", ping(3))  # after the child: its connection, still open

        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        assert appended.wait(30)

        def child() -> bytes:
            code = 2 if theirs[0].closed else 0
            store.append("c", ping(2))
            return bytes([code])

        child_code = in_a_forked_child(child)
        assert child_code == bytes([0])
        release.set()
        thread.join(30)
        assert not thread.is_alive()
        assert [e.data["n"] for e in store.read_all()] == [1, 2, 3]


def test_close_closes_the_writer_connections_and_a_later_write_reopens(sqlite_url: str) -> None:
    store = open_store(sqlite_url)
    store.append("s", ping(1))
    conn = mine(store)
    store.close()
    assert conn.closed
    store.append("s", ping(2))
    assert store.head_position() == 2
    store.close()


CLOSE_RACE = """
import faulthandler, sys, threading, time
faulthandler.enable(all_threads=True)
from pydantic import BaseModel
from trm_store import NewEvent, StoreError, open_store, register_event_type

class Ping(BaseModel):
    n: int

register_event_type("test.ping", Ping)
url = sys.argv[1]
for round_ in range(8):
    store = open_store(url, projections={})
    stop, unexpected, acked = threading.Event(), [], []

    def write(k: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                events = store.append(f"r{round_}-{k}", [NewEvent("test.ping", {"n": n})])
                acked.extend(e.event_id for e in events)
            except StoreError:
                pass  # a write that met the close: refused, typed
            except BaseException as exc:
                unexpected.append(repr(exc))
                return

    threads = [threading.Thread(target=write, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    store.close()
    time.sleep(0.02)
    stop.set()
    for t in threads:
        t.join()
    assert not unexpected, unexpected
    with open_store(url, projections={}) as check:
        stored = {e.event_id for e in check.read_all()}
    assert set(acked) <= stored, "an acknowledged append is missing"
    store.close()
print("ok")
"""


def test_closing_the_store_while_threads_append_is_safe(store_url: str) -> None:
    """close() waits for the writes in flight on other threads instead of closing their
    connections under them (that crashed CPython's sqlite3 with SIGSEGV, in a soak worker
    stopped with SIGTERM); every append acknowledged is stored, the others raise StoreError."""
    done = subprocess.run(
        [sys.executable, "-c", CLOSE_RACE, store_url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_an_interrupted_first_write_leaves_no_connection_that_close_misses(
    sqlite_url: str,
) -> None:
    """A thread's connection opened and leased with an interrupt at each place in turn: the
    connection the thread then names is closed, or one that `close` will close (found by
    review: interrupted at the start of `_Lease.__init__`, the thread kept writing on a
    connection `close` never closed)."""
    with open_store(sqlite_url) as store:
        kept = writers(store)

        def open_interrupted(at: int) -> tuple[InterruptAt, object]:
            tracer = InterruptAt(
                at, traced={trm_store.writer_connections.__file__}, own_starts=True
            )
            outcome: list[object] = []

            def first_write() -> None:
                with traced_by(tracer):  # no collection meanwhile: see traced_by (CI, once)
                    outcome.append(kept.current())
                if not outcome:
                    outcome.append(Interrupted(tracer.where))
                named = getattr(kept._mine, "conn", None)
                outcome.append(named is None or named.closed or named in kept._open)

            thread = threading.Thread(target=first_write)
            thread.start()
            thread.join(LIMIT)
            result, named_is_closable = outcome
            assert named_is_closable, f"interrupted at {tracer.where}: a connection close misses"
            return tracer, [result] if isinstance(result, Connection) else result

        at_each_place(open_interrupted, more_than=5)


def test_a_signal_handler_that_appends_as_the_old_lease_goes_leaves_the_append_its_connection(
    sqlite_url: str,
) -> None:
    """After `store.close()`, the thread's next write leases a new connection and drops the
    old lease, whose `__del__` is Python code: a signal handler that appends runs there. Found
    by review: the handler found the old, closed connection named, leased another and so
    closed the new one, and the interrupted append failed on it."""
    handled: list[object] = []

    def handler(_signum: int, _frame: object) -> None:
        handled.extend(store.append("handler", ping(2)))

    def raise_as_the_lease_goes(frame: FrameType, event: str, _arg: object) -> None:
        if event == "call" and frame.f_code.co_qualname == "_Lease.__del__":
            sys.settrace(None)
            signal.raise_signal(signal.SIGUSR1)  # pending: its handler runs as `__del__` starts

    with open_store(sqlite_url) as store:
        store.append("s", ping(1))  # this thread's connection, and its lease
        store.close()  # closes it; the next write opens another
        previous = signal.signal(signal.SIGUSR1, handler)
        sys.settrace(raise_as_the_lease_goes)
        try:
            store.append("s", ping(3))
        finally:
            sys.settrace(None)
            signal.signal(signal.SIGUSR1, previous)
        assert handled, "the handler never ran"
        assert [e.data["n"] for e in store.read_all()] == [1, 2, 3]
