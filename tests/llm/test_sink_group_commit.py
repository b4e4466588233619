"""The store sink off the loop: group commit, chat() returns only once its event is committed,
a locked SQLite file stalls no stream, a failing store is a typed error, a bounded queue,
flush and close."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from trm_llm import StoreEventSink
from trm_llm.errors import EventSinkError
from trm_llm.group_commit import GroupCommitter
from trm_llm.simulated_server import SimulatedServer, normal
from trm_store import EventValidationError, ReadOnlyStoreError, Store, open_store
from trm_store.domain.llm_calls import llm_calls

from ..light_imports import heavy_modules_loaded
from .conftest import USER, ClientFactory
from .test_breaker_redis import Ticker


class CountingStore:
    """The real store, counting the transactions the sink asks for."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.batches: list[int] = []

    def append_batch(self, items: Sequence[tuple[str, Sequence[Any], int | None]]) -> Any:
        self.batches.append(sum(len(events) for _, events, _ in items))
        return self.store.append_batch(items)


def test_import_trm_llm_loads_no_database_library() -> None:
    # Issue 13 point 3: sink.py imported trm_store (and SQLAlchemy, alembic) with trm_llm.
    assert heavy_modules_loaded("import trm_llm") == []


@pytest.mark.postgres
async def test_concurrent_calls_share_transactions_and_return_once_committed(
    store: Store, server: SimulatedServer, make_client: ClientFactory
) -> None:
    counting = CountingStore(store)
    sink = StoreEventSink(cast(Store, counting))
    client = make_client(sink=sink)
    server.default = normal(["a", "b"], delay_s=0.01)

    async def call() -> bool:
        result = await client.chat(USER)
        return result.call_id in {row["call_id"] for row in llm_calls(store, source="sim")}

    committed = await asyncio.gather(*(call() for _ in range(32)))
    assert all(committed)  # each call's event was in the store when its chat() returned
    assert sum(counting.batches) == 32
    assert len(counting.batches) < 32, counting.batches  # grouped: fewer transactions than events
    await sink.aclose()


LOCKER = textwrap.dedent(
    """
    import sqlite3, sys, time
    db = sqlite3.connect(sys.argv[1], isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    db.execute("COMMIT")
    """
)


async def test_a_locked_sqlite_file_stalls_no_stream(
    tmp_path: Path, server: SimulatedServer, make_client: ClientFactory
) -> None:
    # Issue 15 point 4: while another process held the write lock for 4 s, four healthy streams
    # all failed with stall_inter_token (the sink appended on the loop, which waited on the lock).
    path = tmp_path / "trm.db"
    with open_store(f"sqlite:///{path}") as store:
        sink = StoreEventSink(store)
        client = make_client(sink=sink, inter_token_timeout_s=1.0)
        server.default = normal(["tok"] * 10, delay_s=0.2)  # ~2 s per stream
        locker = subprocess.Popen(
            [sys.executable, "-c", LOCKER, str(path), "4"], stdout=subprocess.PIPE, text=True
        )
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        started = time.perf_counter()
        with Ticker() as ticker:
            first = asyncio.create_task(client.chat(USER))
            await asyncio.sleep(0.5)  # the first finishes, and waits on the lock, before the rest
            results = [await first, *await asyncio.gather(*(client.chat(USER) for _ in range(3)))]
        elapsed = time.perf_counter() - started
        assert locker.wait(timeout=30) == 0
        assert [r.attempts for r in results] == [1, 1, 1, 1]  # no stall, no retry
        assert ticker.worst_gap_s < 0.5, f"the loop stalled {ticker.worst_gap_s:.2f} s"
        assert elapsed >= 3.5  # chat() waited for its event to be committed after the lock
        assert len(llm_calls(store, source="sim")) == 4
        await sink.aclose()


async def test_a_failing_store_is_a_typed_error_from_chat(
    tmp_path: Path, server: SimulatedServer, make_client: ClientFactory
) -> None:
    url = f"sqlite:///{tmp_path / 'trm.db'}"
    open_store(url).close()
    with open_store(url, read_only=True) as store:
        sink = StoreEventSink(store)
        with pytest.raises(EventSinkError) as info:
            await make_client(sink=sink).chat(USER)  # the answer came, its event cannot be kept
        assert isinstance(info.value.__cause__, ReadOnlyStoreError)
        await sink.aclose()


async def test_one_refused_event_fails_alone(store: Store) -> None:
    sink = StoreEventSink(store)
    good = {"from_state": "closed", "to_state": "open", "failures": 1, "at": 0.0, "call_id": "c"}
    receipts = [sink.emit("sim", "breaker_changed", good), sink.emit("sim", "call_completed", {})]
    assert all(receipts)
    outcomes = await asyncio.gather(*(r for r in receipts if r), return_exceptions=True)
    assert outcomes[0] is None
    assert isinstance(outcomes[1], EventSinkError)
    assert isinstance(outcomes[1].__cause__, EventValidationError)
    assert [e.type for e in store.read_stream("llm:sim")] == ["llm.breaker_changed"]
    await sink.aclose()


async def test_flush_waits_for_unawaited_events_and_aclose_ends_the_sink(store: Store) -> None:
    sink = StoreEventSink(store)
    good = {"from_state": "closed", "to_state": "open", "failures": 1, "at": 0.0, "call_id": "c"}
    for _ in range(10):
        sink.emit("sim", "breaker_changed", good)  # as the caches do: nobody awaits these
    await sink.flush()
    assert len(store.read_stream("llm:sim")) == 10
    sink.emit("sim", "breaker_changed", good)
    await sink.aclose()  # drains first
    assert len(store.read_stream("llm:sim")) == 11
    with pytest.raises(EventSinkError):
        sink.emit("sim", "breaker_changed", good)


def test_emit_outside_a_loop_is_committed_when_it_returns(store: Store) -> None:
    sink = StoreEventSink(store)
    good = {"from_state": "closed", "to_state": "open", "failures": 1, "at": 0.0, "call_id": "c"}
    assert sink.emit("sim", "breaker_changed", good) is None
    assert len(store.read_stream("llm:sim")) == 1
    with pytest.raises(EventValidationError):  # the store's own error, as from an append
        sink.emit("sim", "call_completed", {})
    sink.close()


def test_a_producer_thread_blocks_while_the_queue_is_full() -> None:
    release, writing = threading.Event(), threading.Event()
    written: list[int] = []

    def slow_write(items: Sequence[int]) -> list[BaseException | None]:
        writing.set()
        release.wait()
        written.extend(items)
        return [None] * len(items)

    committer: GroupCommitter[int] = GroupCommitter(
        slow_write, max_pending=2, max_batch=10, name="test"
    )
    committer.submit(0)  # taken by the writer, which waits in slow_write
    assert writing.wait(5)
    committer.submit(1)
    committer.submit(2)  # the queue is full now
    fourth = threading.Thread(target=committer.submit, args=(3,))
    fourth.start()
    fourth.join(0.3)
    assert fourth.is_alive()  # backpressure: the producer waits for room
    release.set()
    fourth.join(5)
    assert not fourth.is_alive()
    committer.close()
    assert written == [0, 1, 2, 3]  # in order, nothing lost
