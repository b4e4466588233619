"""A subscription when its connection is lost, and across a fork (review, nineteenth session):
the loss ends the iteration with a StoreError, not the driver's own error; a forked child never
touches its parent's subscription connection, nor waits on a lock a parent's thread held."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, text

import trm_store.wakeups
from tests.conftest import PG_URL
from tests.store.helpers import added, in_a_forked_child
from tests.store.round_trip_proxy import RoundTripProxy, round_trip_proxy
from trm_store import RecordedEvent, Store, StoreError, open_store


@pytest.mark.postgres
def test_a_connection_lost_while_waiting_ends_the_iteration_with_a_store_error(
    pg_url: str,
) -> None:
    with open_store(pg_url) as store:
        _lost_while_waiting(store)


def _lost_while_waiting(store: Store) -> None:
    subscription = store.subscribe()
    first = subscription._step()
    assert first is not None and first.events == []  # caught up: it waits for wake-ups now
    conn = subscription._conn
    assert conn is not None
    pid = conn.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
    admin = create_engine(PG_URL)
    with admin.begin() as c:
        c.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid})
    admin.dispose()
    with pytest.raises(StoreError):
        for _ in range(50):  # each step waits at most 0.1 s for a wake-up
            subscription._step()
    subscription.close()
    assert subscription._conn is None


def test_a_forked_child_closes_its_store_without_touching_the_parents_subscription(
    store: Store,
) -> None:
    """The parent follows in a thread (holding the subscription's lock while it waits); the
    child closes the store it inherited: it neither hangs on that lock nor ends the parent's
    session, and the parent's follower still sees what is appended after."""
    store.append("a", [added(1)])
    subscription = store.subscribe()
    seen: list[str] = []
    follower = threading.Thread(target=lambda: seen.extend(e.stream_id for e in subscription))
    follower.start()
    while not seen:
        time.sleep(0.01)

    def child() -> bytes:
        started = time.monotonic()
        closing = threading.Thread(target=store.close, daemon=True)
        closing.start()
        closing.join(5)
        if closing.is_alive():
            return b"store.close() still waiting after 5 s"
        return f"closed in {time.monotonic() - started:.1f} s".encode()

    said = in_a_forked_child(child)
    assert said.startswith(b"closed in"), said
    assert float(said.split()[2]) < 2
    store.append("b", [added(2)])
    deadline = time.monotonic() + 10
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    subscription.close()
    follower.join(5)
    assert seen == ["a", "b"]
    assert os.getpid()  # the parent is the one still here


@pytest.mark.postgres
def test_a_connection_that_goes_silent_ends_the_iteration_with_a_store_error(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No reset, no error: only the subscriber's heartbeat can tell (`trm_store.wakeups`). An
    idle connection that still answers lives on."""
    monkeypatch.setattr(trm_store.wakeups, "HEARTBEAT_S", 0.5, raising=False)
    monkeypatch.setattr(trm_store.wakeups, "HEARTBEAT_TIMEOUT_S", 1.0, raising=False)
    outcome: list[object] = []
    with _writer_and_follower(pg_url) as (proxy, writer, follower):
        writer.append("a", [added(1)])
        follower_thread = _following(follower.subscribe(), outcome)
        time.sleep(2)  # idle: heartbeats, each answered in time
        assert outcome == [1]
        proxy.silent.set()
        try:
            writer.append("b", [added(2)])
            follower_thread.join(10)
            assert not follower_thread.is_alive(), "the silent connection was never noticed"
            assert outcome[:-1] == [1] and isinstance(outcome[-1], StoreError), outcome
        finally:
            proxy.silent.clear()


@pytest.mark.postgres
def test_a_connection_that_goes_silent_during_a_read_ends_the_iteration(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between two batches of a catch-up: the read in flight is bounded too (a third review: it
    hung for good, and close() could not end it)."""
    monkeypatch.setattr(trm_store.wakeups, "READ_TIMEOUT_S", 1.0, raising=False)
    outcome: list[object] = []
    with _writer_and_follower(pg_url) as (proxy, writer, follower):
        writer.append("s", [added(n) for n in range(1005)])  # two batches of the catch-up

        def at_1000(event: RecordedEvent) -> None:
            if event.position == 1000:  # the path dies before the second batch's read
                proxy.silent.set()

        follower_thread = _following(follower.subscribe(), outcome, at_1000)
        try:
            follower_thread.join(10)
            assert not follower_thread.is_alive(), "the read in flight was never bounded"
            assert outcome[:-1] == list(range(1, 1001)), outcome[-3:]
            assert isinstance(outcome[-1], StoreError), outcome
        finally:
            proxy.silent.clear()


@pytest.mark.postgres
def test_a_read_whose_commit_goes_unanswered_ends_the_iteration(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fourth review: the guard ended before the read's transaction did, so a path that went
    silent at its `COMMIT` hung the iteration for good."""
    monkeypatch.setattr(trm_store.wakeups, "READ_TIMEOUT_S", 1.0, raising=False)
    outcome: list[object] = []
    with _writer_and_follower(pg_url) as (proxy, writer, follower):
        writer.append("s", [added(1)])
        events = iter(follower.subscribe())
        assert next(events).position == 1

        proxy.silent_at = b"COMMIT"
        follower_thread = _following(events, outcome)
        try:
            writer.append("s", [added(2)])  # wakes it: BEGIN, the read, COMMIT
            follower_thread.join(10)
            assert not follower_thread.is_alive(), "the read's COMMIT was never bounded"
            assert len(outcome) <= 2 and isinstance(outcome[-1], StoreError), outcome
        finally:
            proxy.silent_at = None
            proxy.silent.clear()


def test_a_guard_that_fires_late_never_shuts_down_a_socket_that_took_its_number() -> None:
    """A fourth review: the guard shut down whatever socket had the connection's descriptor
    number when it fired; the block may have closed the connection, and another socket may
    have taken that number. It holds a descriptor of its own now."""

    class Driver:
        def __init__(self, sock: socket.socket) -> None:
            self.sock = sock

        def fileno(self) -> int:
            return self.sock.fileno()

    ours, peer = socket.socketpair()
    with trm_store.wakeups.answered_within(Driver(ours), 0.2):
        number = ours.fileno()
        ours.close()  # as an invalidation closes the connection's socket
        other, other_peer = socket.socketpair()
        reused = other if other.fileno() == number else other_peer
        time.sleep(0.5)  # the guard fires before the block ends
    partner = other_peer if reused is other else other
    partner.sendall(b"x")
    assert reused.recv(1) == b"x"
    for sock in (peer, other, other_peer):
        sock.close()


def _following(
    events: Iterable[RecordedEvent],
    outcome: list[object],
    each: Callable[[RecordedEvent], None] = lambda _event: None,
) -> threading.Thread:
    """A started thread that puts each event's position in `outcome` (after `each(event)`),
    then the StoreError that ends the iteration."""

    def follow() -> None:
        try:
            for event in events:
                outcome.append(event.position)
                each(event)
        except StoreError as e:
            outcome.append(e)

    thread = threading.Thread(target=follow)
    thread.start()
    return thread


@contextmanager
def _writer_and_follower(pg_url: str) -> Iterator[tuple[RoundTripProxy, Store, Store]]:
    """A store writing to `pg_url` directly, and one following it through a loopback proxy
    that can go silent."""
    with (
        round_trip_proxy(pg_url) as (proxy, through),
        open_store(pg_url, projections={}) as writer,
        open_store(through, projections={}) as follower,
    ):
        yield proxy, writer, follower
