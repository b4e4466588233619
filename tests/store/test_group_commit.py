"""Group commit (`trm_store.append_queue`): appends that threads make at once are written in one
transaction, and each caller still gets exactly its own outcome.

The groups here are made, not hoped for: the test's thread holds the store's write transaction,
one thread's append takes the turn and waits for it, and the next appends queue behind; when the
transaction ends, the first is written alone and the queued ones as one group (one INSERT, which
a statement listener counts). Both backends.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import Connection, Table, event
from sqlalchemy.exc import DBAPIError

import trm_store.sqlite
from tests.store.helpers import (
    EVENT_INSERTS,
    TOTALS,
    Totals,
    added,
    assert_log_is_whole,
    in_a_forked_child,
    log_of,
    run_and_compare,
    writing_held,
)
from trm_store import (
    ConcurrencyError,
    EventIdConflictError,
    NewEvent,
    RecordedEvent,
    Store,
    StoreError,
    open_store,
    register_event_type,
)

LIMIT = 60.0
"""Seconds a thread may take to get where a test waits for it."""

Outcome = list[RecordedEvent] | BaseException


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIMIT
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.005)


def grouped(
    store: Store, first: Callable[[], object], rest: Sequence[Callable[[], object]]
) -> list[Outcome]:
    """Run `first`, then `rest` queued behind it, each in a thread of its own, while this
    thread holds the write transaction; the outcomes, in the order given."""
    outcomes: dict[int, Outcome] = {}

    def run(n: int, call: Callable[[], object]) -> None:
        try:
            outcomes[n] = call()  # type: ignore[assignment]
        except BaseException as e:
            outcomes[n] = e

    queue = store._appends
    threads = []
    with store.write_transaction():
        threads.append(threading.Thread(target=run, args=(0, first), daemon=True))
        threads[0].start()
        _wait_for(lambda: queue._writing and not queue._queued, "the first append writing")
        for n, call in enumerate(rest, 1):
            threads.append(threading.Thread(target=run, args=(n, call), daemon=True))
            threads[-1].start()
        _wait_for(lambda: len(queue._queued) == len(rest), "the others queued")
    for thread in threads:
        thread.join(LIMIT)
        assert not thread.is_alive()
    return [outcomes[n] for n in range(len(threads))]


def test_queued_appends_share_one_transaction_and_each_is_refused_alone(store: Store) -> None:
    inserts = Statements(store, EVENT_INSERTS)
    outcomes = grouped(
        store,
        lambda: store.append("warm", [added(1)]),
        [
            lambda: store.append("s1", [added(2)], expected_version=0),
            lambda: store.append("s1", [added(3)], expected_version=0),  # s1 is at 1 by then
            lambda: store.append("s1", [added(4), added(5)], expected_version=1),
            lambda: store.append_batch([("s2", [added(6)], None), ("s3", [added(7)], 5)]),
            lambda: store.append("s4", [added(8)], expected_version=0),
        ],
    )
    assert inserts.count == 2  # the first alone, the five queued ones together
    warm, first, refused, second, batch, last = outcomes
    assert isinstance(refused, ConcurrencyError) and "at version 1, expected 0" in str(refused)
    assert isinstance(batch, ConcurrencyError) and "'s3'" in str(batch)
    log = log_of(store)
    assert [warm, first, second, last] == [log[0:1], log[1:2], log[2:4], log[4:5]]
    assert [(e.stream_id, e.version, e.data["amount"]) for e in log] == [
        ("warm", 1, 1),
        ("s1", 1, 2),
        ("s1", 2, 4),
        ("s1", 3, 5),
        ("s4", 1, 8),
    ]
    assert_log_is_whole(store)


def test_a_refused_id_in_a_group_leaves_every_other_append_its_own_outcome(store: Store) -> None:
    (taken,) = store.append("owner", [added(1)])
    retry = [added(1, event_id=taken.event_id)]
    inserts = Statements(store, EVENT_INSERTS)
    outcomes = grouped(
        store,
        lambda: store.append("warm", [added(2)]),
        [
            lambda: store.append("a", [added(3)]),
            lambda: store.append("b", [added(4, event_id=taken.event_id)]),  # another stream
            lambda: store.append("owner", retry),  # the same event again: a retry
            lambda: store.append("c", [added(5)], expected_version=0),
        ],
    )
    warm, a, conflict, again, c = outcomes
    assert isinstance(conflict, EventIdConflictError)
    assert again == [taken]
    log = log_of(store)
    assert [warm, a, c] == [log[1:2], log[2:3], log[3:4]]
    assert [e.stream_id for e in log] == ["owner", "warm", "a", "c"]
    assert inserts.count == 1 + 1 + 4  # the first; the group's, refused; then each alone
    assert_log_is_whole(store)


class Interrupting(Totals):
    """The test projection, which raises KeyboardInterrupt once, at the amount 666: an
    interrupt that reaches the thread writing a group (a signal's handler raises it there)."""

    def __init__(self) -> None:
        self.armed = True

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        if self.armed and any(e.data["amount"] == 666 for e in events):
            self.armed = False
            raise KeyboardInterrupt
        super().apply(conn, tables, events)


def test_an_interrupt_while_a_group_is_written_ends_only_the_writer_s_own_append(
    store_url: str,
) -> None:
    """The group rolls back; the writing thread's append ends with the interrupt, unwritten;
    every other append of the group goes back to the queue and is written once."""
    with open_store(store_url, projections={"test_totals": Interrupting()}) as store:
        outcomes = grouped(
            store,
            lambda: store.append("warm", [added(1)]),
            [lambda n=n: store.append(f"s{n}", [added(666 if n == 2 else n)]) for n in range(1, 5)],
        )
        interrupted = [n for n, o in enumerate(outcomes) if isinstance(o, KeyboardInterrupt)]
        assert len(interrupted) == 1, outcomes
        log = log_of(store)
        written = {e.stream_id: e for e in log}
        for n, outcome in enumerate(outcomes[1:], 1):
            if n in interrupted:
                assert f"s{n}" not in written
            else:
                assert outcome == [written[f"s{n}"]]
        assert len(log) == 4
        assert_log_is_whole(store)


class _Unprojected(BaseModel):
    amount: int


register_event_type("test.unprojected", _Unprojected)


@pytest.mark.parametrize("kind", ["test.added", "test.unprojected"])
def test_threads_appending_at_once_each_get_exactly_their_outcome(store: Store, kind: str) -> None:
    """8 threads, 5 streams, expected versions from reads that go stale: whatever was grouped,
    each append that returned is in the log as returned, each refused one is nowhere in it;
    for events an inline projection takes and for events none takes."""
    returned: list[list[RecordedEvent]] = []
    refused: list[list[str]] = []
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(30):
            stream = f"s{rng.randrange(5)}"
            expected = store.stream_version(stream) if rng.random() < 0.6 else None
            ids = [str(uuid.uuid4()) for _ in range(rng.randint(1, 3))]
            events = [NewEvent(kind, {"amount": rng.randint(1, 9)}, event_id=i) for i in ids]
            try:
                recorded = store.append(stream, events, expected_version=expected)
            except ConcurrencyError:
                with lock:
                    refused.append(ids)
                continue
            assert [e.event_id for e in recorded] == ids
            with lock:
                returned.append(recorded)

    log = run_and_compare(store, worker, 8, returned)
    assert not {i for ids in refused for i in ids} & set(log)


# -- found by review: each of these failed on the first version of group commit -------------------


def test_an_append_interrupted_while_it_waits_to_be_written_is_never_written(
    store: Store,
) -> None:
    """The caller was told it was interrupted: the next writer must not write it later. (The
    main thread's wait is the one a signal interrupts, as Ctrl-C would.)"""
    queue = store._appends
    holding, release = threading.Event(), threading.Event()

    def writer_writing() -> None:
        with writing_held(queue):
            holding.set()
            release.wait(LIMIT)

    def interrupt(*_: object) -> None:
        raise Interrupted

    holder = threading.Thread(target=writer_writing, daemon=True)
    holder.start()
    assert holding.wait(LIMIT)
    previous = signal.signal(signal.SIGUSR1, interrupt)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        timer.start()
        with pytest.raises(Interrupted):
            store.append("mine", [added(42)])
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
        release.set()
        holder.join(LIMIT)
    store.append("other", [added(1)])
    assert [e.stream_id for e in log_of(store)] == ["other"]


class Interrupted(BaseException):
    """What the test's signal handler raises: an interrupt, as KeyboardInterrupt is."""


class Appending(Totals):
    """The test projection, which appends to its own store while it applies (a nested write)."""

    store: Store | None = None

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        super().apply(conn, tables, events)
        if self.store is not None and any(e.stream_id == "trigger" for e in events):
            self.store.append("nested", [added(0)])


def test_an_append_from_inside_a_group_s_write_is_refused_at_once(sqlite_url: str) -> None:
    """Not a hang on the writer's own turn: the same "do not nest" error as before."""
    projection = Appending()
    with open_store(sqlite_url, projections={"test_totals": projection}) as store:
        projection.store = store
        outcome: list[object] = []
        thread = threading.Thread(
            target=lambda: outcome.append(_outcome(lambda: store.append("trigger", [added(1)]))),
            daemon=True,
        )
        thread.start()
        thread.join(LIMIT)
        assert not thread.is_alive(), "the nested append hung"
        assert isinstance(outcome[0], StoreError) and "do not nest" in str(outcome[0])
        store.append("after", [added(2)])  # the store still writes
        assert [e.stream_id for e in log_of(store)] == ["after"]


def _outcome(call: Callable[[], object]) -> object:
    try:
        return call()
    except Exception as e:
        return e


def test_a_database_error_of_the_group_s_transaction_reaches_every_append_at_once(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another program holds the database past the busy timeout: the group's callers get that
    error from the group's one try, not one timeout more each."""
    monkeypatch.setattr(trm_store.sqlite, "BUSY_TIMEOUT_MS", 300)
    with open_store(sqlite_url, projections=TOTALS) as store:
        store.append("warm", [added(1)])
        begins = Statements(store, ("BEGIN IMMEDIATE",))
        other = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
        outcomes: dict[int, object] = {}
        threads = [
            threading.Thread(
                target=lambda n=n: outcomes.__setitem__(
                    n, _outcome(lambda: store.append(f"s{n}", [added(n)]))
                ),
                daemon=True,
            )
            for n in range(5)
        ]
        queue = store._appends
        try:
            with writing_held(queue):  # all five queue behind it, and go as one group
                for thread in threads:
                    thread.start()
                _wait_for(lambda: len(queue._queued) == 5, "the five queued")
                other.execute("BEGIN IMMEDIATE")
            for thread in threads:
                thread.join(LIMIT)
        finally:
            other.close()
        assert all(
            isinstance(o, StoreError) and "busy timeout" in str(o) for o in outcomes.values()
        )
        assert begins.count == 1
        assert [e.stream_id for e in log_of(store)] == ["warm"]


class Statements:
    """Counts the statements the store sends that start with one of `prefixes`."""

    def __init__(self, store: Store, prefixes: tuple[str, ...]) -> None:
        self.count = 0
        self._prefixes = prefixes
        event.listen(store._backend.engine, "before_cursor_execute", self._seen)

    def _seen(self, *args: Any) -> None:
        if args[2].lstrip().startswith(self._prefixes):
            self.count += 1


def test_an_append_batch_to_more_streams_than_one_query_takes(store: Store) -> None:
    """The streams' versions are read in chunks: no IN list past a database's parameter limit
    (on SQLite the test lowers it to the oldest builds' 999; PostgreSQL's is 65,535)."""
    if store.dialect == "sqlite":
        backend = store._backend
        assert isinstance(backend, trm_store.sqlite.SqliteBackend)
        raw = backend._writers.current().connection.dbapi_connection
        assert isinstance(raw, sqlite3.Connection)
        raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
    streams = 3 * 512 + 5
    recorded = store.append_batch([(f"s{k}", [added(k)], None) for k in range(streams)])
    assert len(recorded) == streams and all(e.version == 1 for e in recorded)
    again = store.append_batch([(f"s{k}", [added(k)], 1) for k in range(0, streams, 7)])
    assert all(e.version == 2 for e in again)


def test_a_forked_child_s_threads_append_through_a_fresh_queue(sqlite_url: str) -> None:
    """Forked while a parent's thread was writing: the child's threads, appending at once,
    each get their append written."""
    with open_store(sqlite_url, projections=TOTALS) as store:
        store.append("parent", [added(0)])

        def child() -> bytes:
            if store._appends._writing:
                return b"the parent's writer is still writing in the child"
            barrier = threading.Barrier(4)
            done: list[object] = []

            def one(n: int) -> None:
                barrier.wait()
                done.append(_outcome(lambda: store.append(f"c{n}", [added(n)])))

            threads = [threading.Thread(target=one, args=(n,)) for n in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            ok = all(isinstance(d, list) and len(d) == 1 for d in done) and len(done) == 4
            return b"ok" if ok else repr(done).encode()

        with writing_held(store._appends):  # this thread writing when the child is forked
            said = in_a_forked_child(child)
        assert said == b"ok"
        assert {e.stream_id for e in log_of(store)} == {"parent", "c0", "c1", "c2", "c3"}


class _SwallowsForThirteen(Totals):
    """`Totals`, whose `apply` also catches a database error of its own for an amount of 13:
    PostgreSQL ends the transaction at it, and would answer its COMMIT with a rollback."""

    name = "test_swallows_for_13"

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        super().apply(conn, tables, events)
        if any(e.data["amount"] == 13 for e in events):
            with contextlib.suppress(DBAPIError):
                conn.exec_driver_sql("SELECT 1/0")


@pytest.mark.postgres
def test_an_error_one_append_s_projection_swallowed_refuses_that_append_only(pg_url: str) -> None:
    """The aborted transaction is not every append's failure (review, twenty-second session: all
    five of a group were refused): the group's appends go one by one, each to its own outcome."""
    projection = _SwallowsForThirteen()
    with open_store(pg_url, projections={projection.name: projection}) as store:
        outcomes = grouped(
            store,
            lambda: store.append("warm", [added(1)]),
            [lambda n=n: store.append(f"s{n}", [added(13 if n == 2 else n)]) for n in range(1, 5)],
        )
        refused = outcomes[2]
        assert isinstance(refused, StoreError) and "error was caught" in str(refused)
        written = [o for n, o in enumerate(outcomes) if n != 2]
        assert all(isinstance(o, list) for o in written), written
        assert [e.stream_id for e in store.read_all()] == ["warm", "s1", "s3", "s4"]
        assert store.verify_projections() == []
