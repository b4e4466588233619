"""The child-process sink on an event loop: the loop ships the batches (`trm_llm.sink_loop`,
`ChildWriter.awrite`), sharing the child with the writer thread; and what two hostile reviews
of that path found, each test failing on the code before its fix."""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import threading
import time
from typing import Any

import pytest

from trm_llm import StoreEventSink, sink_process
from trm_llm.errors import EventSinkError
from trm_store import open_store

from .test_sink_child_process import GOOD, child_sink, gone, writer_children

# -- on an event loop the loop ships the batches (trm_llm.sink_loop) ----------------------------


async def test_on_a_loop_no_writer_thread_runs_and_concurrent_events_share_requests(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests: list[int] = []
    awrite = sink_process.ChildWriter.awrite

    async def counted(self: sink_process.ChildWriter, events: Any, sending: Any) -> Any:
        requests.append(len(events))
        return await awrite(self, events, sending)

    monkeypatch.setattr(sink_process.ChildWriter, "awrite", counted)
    with open_store(sqlite_url) as store, child_sink(sqlite_url) as sink:
        receipts = [
            sink.emit("sim", "breaker_changed", {**GOOD, "failures": i}) for i in range(300)
        ]
        await asyncio.gather(*(r for r in receipts if r))
        assert sink._writer._thread is None  # type: ignore[attr-defined]  # never started
        assert sum(requests) == 300 and len(requests) < 10, requests
        assert [e.data["failures"] for e in store.read_stream("llm:sim")] == list(range(300))


async def test_a_batch_cancelled_mid_request_shuts_its_child_down_and_the_next_starts_anew(
    sqlite_url: str,
) -> None:
    """Cancelled while waiting for the child's answer, the socket is out of step: that child
    must never get another request (its late answer would be taken for the next batch's)."""
    with open_store(sqlite_url) as store, child_sink(sqlite_url) as sink:
        await sink.emit("sim", "breaker_changed", GOOD)  # type: ignore[misc]
        (pid,) = writer_children(os.getpid())
        os.kill(pid, signal.SIGSTOP)
        receipt = sink.emit("sim", "breaker_changed", {**GOOD, "failures": 2})
        await asyncio.sleep(0.2)  # sent; the stopped child does not answer
        shipping = sink._shippers[asyncio.get_running_loop()]._task  # type: ignore[attr-defined]
        assert shipping is not None
        shipping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await receipt  # type: ignore[misc]
        os.kill(pid, signal.SIGCONT)  # it writes that batch, finds the socket shut, exits
        assert gone(pid, within_s=30)
        await sink.emit("sim", "breaker_changed", {**GOOD, "failures": 3})  # type: ignore[misc]
        assert writer_children(os.getpid()) not in ([], [pid])
        failures = [e.data["failures"] for e in store.read_stream("llm:sim")]
        assert failures in ([1, 3], [1, 2, 3])  # the cancelled one may or may not be there


def test_a_thread_and_two_loops_share_the_child_one_request_at_a_time(sqlite_url: str) -> None:
    def on_a_loop(tag: int) -> None:
        async def emit_all() -> None:
            receipts = [
                sink.emit("sim", "breaker_changed", {**GOOD, "failures": tag + i})
                for i in range(200)
            ]
            await asyncio.gather(*(r for r in receipts if r))

        asyncio.run(emit_all())

    def from_a_thread() -> None:
        for i in range(100):
            assert sink.emit("sim", "breaker_changed", {**GOOD, "failures": 20_000 + i}) is None

    with open_store(sqlite_url) as store, child_sink(sqlite_url) as sink:
        workers = [
            threading.Thread(target=on_a_loop, args=(0,)),
            threading.Thread(target=on_a_loop, args=(10_000,)),
            threading.Thread(target=from_a_thread),
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        failures = sorted(e.data["failures"] for e in store.read_stream("llm:sim"))
        expected = [*range(200), *range(10_000, 10_200), *range(20_000, 20_100)]
        assert failures == expected
        assert len(writer_children(os.getpid())) == 1  # one child served all three


async def test_after_close_an_emit_on_the_loop_is_refused_and_starts_no_child(
    sqlite_url: str,
) -> None:
    with open_store(sqlite_url) as store:
        sink = StoreEventSink.in_child_process(sqlite_url)
        await sink.emit("sim", "breaker_changed", GOOD)  # type: ignore[misc]
        sink.close()  # blocking, from the loop's own thread: nothing was queued
        with pytest.raises(EventSinkError, match="closed"):
            sink.emit("sim", "breaker_changed", GOOD)
        await asyncio.sleep(0.2)
        assert writer_children(os.getpid()) == []
        assert len(store.read_stream("llm:sim")) == 1


# -- what a hostile review of the loop's path found (each failed before its fix) ---------------


def test_events_nobody_awaited_are_written_when_asyncio_run_ends(sqlite_url: str) -> None:
    """The cache and the Redis breaker emit without awaiting: when `asyncio.run` ends it cancels
    the shipper, and what it had not sent goes to the writer thread instead of being dropped."""

    async def fire_and_forget(first: int, n: int) -> None:
        for i in range(first, first + n):
            sink.emit("sim", "breaker_changed", {**GOOD, "failures": i})

    with open_store(sqlite_url) as store, child_sink(sqlite_url) as sink:
        asyncio.run(fire_and_forget(0, 2000))
        for run in range(5):  # short runs: each one's shipper is cancelled at once
            asyncio.run(fire_and_forget(2000 + run, 1))
        sink.close()
        failures = [e.data["failures"] for e in store.read_stream("llm:sim")]
        assert sorted(failures) == list(range(2005))


async def test_a_shipper_cancelled_before_its_first_step_jams_nothing(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store, child_sink(sqlite_url) as sink:
        receipt = sink.emit("sim", "breaker_changed", {**GOOD, "failures": 1})
        shipper = sink._shippers[asyncio.get_running_loop()]  # type: ignore[attr-defined]
        shipper._task.cancel()  # before it ran at all
        await asyncio.wait_for(receipt, 30)  # type: ignore[arg-type]  # the thread wrote it
        await asyncio.wait_for(sink.emit("sim", "breaker_changed", GOOD), 30)  # type: ignore[arg-type]
        assert len(store.read_stream("llm:sim")) == 2


async def test_close_on_the_loops_own_thread_fails_in_flight_events_at_once(
    sqlite_url: str,
) -> None:
    """Blocking `close()` on the loop's thread: the loop cannot ship meanwhile, so its events
    fail at once (not after the 120 s answer timeout), typed, and the child still exits."""
    with open_store(sqlite_url) as store:
        sink = StoreEventSink.in_child_process(sqlite_url)
        await sink.emit("sim", "breaker_changed", GOOD)  # type: ignore[misc]
        (pid,) = writer_children(os.getpid())
        os.kill(pid, signal.SIGSTOP)
        receipts = [sink.emit("sim", "breaker_changed", GOOD) for _ in range(20)]
        await asyncio.sleep(0.2)  # the first batch is sent, the stopped child holds it
        threading.Timer(0.5, os.kill, (pid, signal.SIGCONT)).start()
        started = time.monotonic()
        sink.close()
        outcomes = await asyncio.gather(*(r for r in receipts if r), return_exceptions=True)
        assert time.monotonic() - started < 30
        assert all(isinstance(o, EventSinkError) for o in outcomes)
        assert gone(pid, within_s=30)
        assert len(store.read_stream("llm:sim")) in (1, 21)  # the batch may or may not be in


def test_a_forked_client_cannot_use_the_sink_on_a_loop_either(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store, child_sink(sqlite_url) as sink:

        async def emit() -> None:
            await sink.emit("sim", "breaker_changed", GOOD)  # type: ignore[misc]

        asyncio.run(emit())
        read, write = os.pipe()
        forked = os.fork()
        if forked == 0:
            signal.alarm(10)
            try:
                asyncio.run(emit())
                os.write(write, b"emitted")
            except EventSinkError:
                os.write(write, b"refused")
            os._exit(0)
        try:
            os.close(write)
            assert os.read(read, 16) == b"refused"
        finally:
            os.waitpid(forked, 0)
            os.close(read)
        assert len(store.read_stream("llm:sim")) == 1


def test_the_sink_works_with_descriptors_above_1023(sqlite_url: str) -> None:
    """Waits use `poll`: `select` refuses a descriptor of 1024 or more."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with open_store(sqlite_url) as store, child_sink(sqlite_url) as sink:
            assert sink._child._child.sock.fileno() > 1023  # type: ignore[union-attr]
            assert sink.emit("sim", "breaker_changed", GOOD) is None

            async def emit() -> None:
                await sink.emit("sim", "breaker_changed", GOOD)  # type: ignore[misc]

            asyncio.run(emit())
            assert len(store.read_stream("llm:sim")) == 2
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_loop_that_ended_mid_batch_leaves_no_task_in_the_sink(sqlite_url: str) -> None:
    """A finished shipper task was kept (and through it its loop, in the sink's per-loop
    dictionary, for good); and its loop's events are all written."""
    with open_store(sqlite_url) as store, child_sink(sqlite_url) as sink:

        async def emit_and_leave() -> None:
            sink.emit("sim", "breaker_changed", GOOD)

        for _ in range(5):
            asyncio.run(emit_and_leave())
        assert sink.emit("sim", "breaker_changed", GOOD) is None  # after what the loops left
        shippers = list(sink._shippers.values())  # type: ignore[attr-defined]
        assert all(shipper._task is None for shipper in shippers)
        assert len(store.read_stream("llm:sim")) == 6


# -- and what a second review found in the fixes (each failed before its fix) ------------------


def _hold_the_write_lock(sqlite_url: str, seconds: float) -> None:
    """Another process's write transaction on the file (from a thread here): the child's
    batch waits for it, so a request is in flight meanwhile."""
    import sqlite3

    def hold() -> None:
        conn = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        time.sleep(seconds)
        conn.execute("ROLLBACK")
        conn.close()

    threading.Thread(target=hold).start()
    time.sleep(0.1)


def test_close_after_a_loop_stopped_mid_request_writes_what_it_left(sqlite_url: str) -> None:
    """The stopped loop's task holds the child's socket for good: the writer thread shuts that
    child down and writes the rest on a new one, instead of waiting forever."""
    with open_store(sqlite_url) as store:
        sink = StoreEventSink.in_child_process(sqlite_url, max_batch=10)
        loop = asyncio.new_event_loop()

        async def emit_and_stop() -> None:
            for i in range(100):
                sink.emit("sim", "breaker_changed", {**GOOD, "failures": i})
            await asyncio.sleep(0.2)  # the first 10 are in the child, waiting for the lock

        _hold_the_write_lock(sqlite_url, 0.5)
        loop.run_until_complete(emit_and_stop())
        closing = threading.Thread(target=sink.close, daemon=True)  # it hung: fail, not hang
        closing.start()
        closing.join(30)
        assert not closing.is_alive()
        loop.close()
        failures = [e.data["failures"] for e in store.read_stream("llm:sim")]
        assert sorted(failures) == list(range(100))


async def test_close_on_the_loops_thread_with_a_thread_emitting_returns(sqlite_url: str) -> None:
    outcome: dict[str, str] = {}

    def emit_from_a_thread() -> None:
        try:
            sink.emit("other", "breaker_changed", GOOD)
            outcome["thread"] = "committed"
        except EventSinkError:
            outcome["thread"] = "refused"

    with open_store(sqlite_url) as store:
        sink = StoreEventSink.in_child_process(sqlite_url)
        _hold_the_write_lock(sqlite_url, 1.0)
        receipts = [sink.emit("sim", "breaker_changed", GOOD) for _ in range(50)]
        await asyncio.sleep(0.1)  # in the child, the socket held by this loop
        emitter = threading.Thread(target=emit_from_a_thread)
        emitter.start()
        await asyncio.sleep(0.1)
        faulthandler.dump_traceback_later(120, exit=True)  # it hung: end the run, loudly
        try:
            sink.close()  # blocking, on the loop's own thread
        finally:
            faulthandler.cancel_dump_traceback_later()
        emitter.join(30)
        assert outcome == {"thread": "refused"}  # failed typed, never waited for good
        outcomes = await asyncio.gather(*(r for r in receipts if r), return_exceptions=True)
        assert all(isinstance(o, EventSinkError) for o in outcomes)
        assert len(store.read_stream("llm:sim")) in (0, 50)


def test_close_from_a_thread_racing_the_end_of_asyncio_run_loses_nothing(
    sqlite_url: str,
) -> None:
    """What the ending loop's task had queued is handed to the writer thread before close()
    stops it (it was refused: the task marked itself idle before draining)."""
    closed: list[str] = []

    def close() -> None:
        sink.close()
        closed.append("returned")

    async def emit_then_end() -> None:
        _hold_the_write_lock(sqlite_url, 0.6)
        for i in range(100):
            sink.emit("sim", "breaker_changed", {**GOOD, "failures": i})
        await asyncio.sleep(0.1)  # the first batch is in the child, 90 queued
        threading.Thread(target=close).start()
        await asyncio.sleep(0.1)  # close() waits for this loop's flush; then the loop ends

    with open_store(sqlite_url) as store:
        sink = StoreEventSink.in_child_process(sqlite_url, max_batch=10)
        asyncio.run(emit_then_end())
        deadline = time.monotonic() + 30
        while not closed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert closed == ["returned"]
        failures = [e.data["failures"] for e in store.read_stream("llm:sim")]
        assert failures == list(range(100))  # none lost, in order


def test_a_batch_cut_mid_frame_is_handed_on_not_lost(sqlite_url: str) -> None:
    """A frame larger than the socket's buffer is still being sent when `asyncio.run` ends:
    the child gets part of it and writes none of it, so the batch goes to the thread."""

    async def emit_and_end() -> None:
        for i in range(5000):
            sink.emit("sim", "breaker_changed", {**GOOD, "failures": i, "call_id": "x" * 255})
        for _ in range(3):
            await asyncio.sleep(0)

    with open_store(sqlite_url) as store:
        sink = StoreEventSink.in_child_process(sqlite_url, max_batch=2048)
        asyncio.run(emit_and_end())
        sink.close()
        failures = [e.data["failures"] for e in store.read_stream("llm:sim")]
        assert sorted(failures) == list(range(5000))
