"""`Store.subscribe`: catch up, then follow the log live, in position order, none skipped or
repeated, in this process and in another; sync and async; closing or cancelling releases the
subscription's connection."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import PG_URL
from tests.store.helpers import TOTALS, Added, added
from trm_store import NewEvent, RecordedEvent, Store, open_store, register_event_type
from trm_store.subscription import Subscription

register_event_type("test.rare", Added)

ROOT = Path(__file__).resolve().parents[2]
WRITERS, APPENDS = 4, 150


def _append_later(store: Store, streams: list[str], delay: float = 0.2) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        for stream in streams:
            store.append(stream, [added(1)])

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _take(events: Iterator[RecordedEvent], n: int) -> list[RecordedEvent]:
    """The next `n` events (fewer if the subscription closes)."""
    return list(itertools.islice(events, n))


@pytest.fixture(autouse=True)
def _watchdog(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every subscription of a test is closed after 20 s: a missed event fails, not hangs."""
    opened: list[Subscription] = []
    real_init = Subscription.__init__

    def init(self: Subscription, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(Subscription, "__init__", init)
    timers = []

    def close_all() -> None:
        for subscription in opened:
            subscription.close()

    timers.append(threading.Timer(20, close_all))
    timers[0].daemon = True
    timers[0].start()
    yield
    timers[0].cancel()


def test_catches_up_then_follows_live(store: Store) -> None:
    store.append("a", [added(1), added(2)])
    with store.subscribe(1) as subscription:
        events = iter(subscription)
        assert [e.position for e in _take(events, 1)] == [2]
        writer = _append_later(store, ["b", "a"])
        assert [(e.position, e.stream_id) for e in _take(events, 2)] == [(3, "b"), (4, "a")]
        writer.join()
        assert subscription.position == 4


def test_filters_as_read_all_does(store: Store) -> None:
    store.append("run:1", [added(1), NewEvent("test.rare", {"amount": 2})])
    with store.subscribe(types=["test.rare"], stream_prefix="run:") as subscription:
        events = iter(subscription)
        writer = _append_later(store, ["gate:1", "run:2"])
        store_rare = threading.Thread(
            target=lambda: (
                time.sleep(0.4),
                store.append("run:3", [NewEvent("test.rare", {"amount": 3})]),
            )
        )
        store_rare.start()
        got = _take(events, 2)
        writer.join()
        store_rare.join()
    assert [(e.stream_id, e.type) for e in got] == [("run:1", "test.rare"), ("run:3", "test.rare")]


def _connection_gone(store: Store, subscription: Subscription, pid: int | None) -> bool:
    """The subscription holds no connection, and on PostgreSQL its backend has ended."""
    if subscription._conn is not None:
        return False
    if pid is None:
        return True
    admin = create_engine(PG_URL)
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with admin.connect() as conn:
                alive = conn.execute(
                    text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"), {"p": pid}
                ).scalar_one()
            if not alive:
                return True
            time.sleep(0.05)
        return False
    finally:
        admin.dispose()


def _backend_pid(subscription: Subscription) -> int | None:
    conn = subscription._conn
    assert conn is not None, "the subscription has not opened its connection"
    if conn.dialect.name != "postgresql":
        return None
    return int(conn.connection.dbapi_connection.info.backend_pid)  # type: ignore[union-attr]


def _checked_out(store: Store) -> int:
    return int(store._backend.engine.pool.checkedout())  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", ["close", "with", "break", "generator-close"])
def test_ending_a_subscription_releases_its_connection(store: Store, how: str) -> None:
    store.append("a", [added(1)])
    baseline = _checked_out(store)
    subscription = store.subscribe()
    events = iter(subscription)
    next(events)
    pid = _backend_pid(subscription)
    if how == "close":
        subscription.close()
    elif how == "with":
        with subscription:
            pass
    elif how == "break":
        for _event in events:
            break
        del events
    else:
        events.close()  # type: ignore[attr-defined]
    assert subscription.closed
    assert _connection_gone(store, subscription, pid)
    assert _checked_out(store) == baseline
    assert list(subscription) == []  # a closed subscription yields nothing more


def test_closing_the_store_closes_its_subscriptions(store_url: str) -> None:
    store = open_store(store_url, projections=TOTALS)
    subscription = store.subscribe()
    first = subscription._step()
    assert first is not None and first.events == []  # opened its connection; the log is empty
    assert subscription._conn is not None
    store.close()
    assert subscription.closed and subscription._conn is None


def test_close_from_another_thread_ends_a_waiting_loop(store: Store) -> None:
    subscription = store.subscribe()
    threading.Timer(0.3, subscription.close).start()
    started = time.monotonic()
    assert list(subscription) == []
    assert time.monotonic() - started < 2


async def test_async_iteration_follows_without_blocking_the_loop(store: Store) -> None:
    await asyncio.to_thread(store.append, "a", [added(1)])
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    writer = _append_later(store, ["b", "c"], delay=0.5)
    got = []
    async with store.subscribe() as subscription:
        async for event in subscription:
            got.append(event.stream_id)
            if len(got) == 3:
                break
    writer.join()
    ticking.cancel()
    assert got == ["a", "b", "c"]
    # Waiting for the appends took ~0.5 s; the loop ran its ticker throughout (a wait on the
    # loop would stall it for the whole 0.5 s; the margin is for a loaded machine).
    assert max(gaps) < 0.3, max(gaps)
    assert subscription.closed and subscription._conn is None


async def test_cancelling_an_async_subscriber_releases_its_connection(store: Store) -> None:
    subscription = store.subscribe()
    pid: list[int | None] = []

    async def follow() -> None:
        async for _event in subscription:
            pass

    task = asyncio.create_task(follow())
    while subscription._conn is None:
        await asyncio.sleep(0.01)
    pid.append(_backend_pid(subscription))
    await asyncio.sleep(0.2)  # waiting for appends now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert subscription.closed
    assert await asyncio.to_thread(_connection_gone, store, subscription, pid[0])


def _spawn(*args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.store.workers", *args]
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.strip() == "ready", (line, process.stderr.read() if process.stderr else "")


@pytest.mark.slow
def test_followers_in_other_processes_see_every_event_of_four_writers(store_url: str) -> None:
    open_store(store_url, projections=TOTALS).close()
    total = WRITERS * APPENDS
    everything = _spawn("subscribe", store_url, str(total), "240")
    own_streams = _spawn("subscribe", store_url, str(WRITERS * APPENDS // 2), "240", "w")
    for follower in (everything, own_streams):
        _wait_ready(follower)
    writers = [_spawn("append", store_url, str(w), str(APPENDS)) for w in range(WRITERS)]
    for writer in writers:
        _out, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err
    seen: dict[str, Any] = {}
    for name, follower in (("all", everything), ("w", own_streams)):
        out, err = follower.communicate(timeout=300)
        assert follower.returncode == 0, err
        seen[name] = [(int(p), s) for p, s in (line.split() for line in out.splitlines())]

    with open_store(store_url, projections=TOTALS) as store:
        log = [(e.position, e.stream_id) for e in store.read_all()]
    assert len(log) == total
    assert seen["all"] == log  # every event, in position order, none skipped or repeated
    assert seen["w"] == [(p, s) for p, s in log if s.startswith("w")]
