"""The store sink with its store work in a child process (`StoreEventSink.in_child_process`):
the same promises as the thread writer (chat() returns once its event is committed, typed
errors, one refused event fails alone), and the child's own hazards: it dies, its parent dies,
a Ctrl-C reaches the process group, a URL holds a password."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from trm_llm import StoreEventSink, sink_process
from trm_llm.errors import EventSinkError
from trm_llm.simulated_server import SimulatedServer, normal
from trm_store import EventValidationError, StoreError, StoreURLError, open_store
from trm_store.domain.llm_calls import llm_calls

from .conftest import USER, ClientFactory

GOOD = {"from_state": "closed", "to_state": "open", "failures": 1, "at": 0.0, "call_id": "c"}


def writer_children(parent: int) -> list[int]:
    """The pids of `parent`'s children that run the sink's child writer."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == parent and b"trm_llm.sink_process" in cmdline:
            found.append(int(entry.name))
    return found


def gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":  # exited, not yet reaped by its (dead) parent's successor
            return True
        time.sleep(0.05)
    return False


@contextmanager
def child_sink(url: str) -> Iterator[StoreEventSink]:
    sink = StoreEventSink.in_child_process(url)
    try:
        yield sink
    finally:
        sink.close()


@pytest.mark.postgres
async def test_chat_returns_once_the_child_committed_its_event(
    store_url: str, server: SimulatedServer, make_client: ClientFactory
) -> None:
    with open_store(store_url) as store, child_sink(store_url) as sink:
        client = make_client(sink=sink)
        server.default = normal(["a", "b"], delay_s=0.01)

        async def call() -> bool:
            result = await client.chat(USER)
            return result.call_id in {row["call_id"] for row in llm_calls(store, source="sim")}

        assert all(await asyncio.gather(*(call() for _ in range(32))))
        await sink.aclose()
        assert len(llm_calls(store, source="sim")) == 32


async def test_a_refused_event_fails_alone_with_the_stores_error_chained(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store, child_sink(sqlite_url) as sink:
        receipts = [
            sink.emit("sim", "breaker_changed", GOOD),
            sink.emit("sim", "call_completed", {}),  # refused: no field of a call
        ]
        outcomes = await asyncio.gather(*(r for r in receipts if r), return_exceptions=True)
        assert outcomes[0] is None
        assert isinstance(outcomes[1], EventSinkError)
        assert isinstance(outcomes[1].__cause__, EventValidationError)
        assert [e.type for e in store.read_stream("llm:sim")] == ["llm.breaker_changed"]


def test_emit_outside_a_loop_raises_the_stores_own_error(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store, child_sink(sqlite_url) as sink:
        assert sink.emit("sim", "breaker_changed", GOOD) is None
        assert len(store.read_stream("llm:sim")) == 1  # committed when emit returned
        with pytest.raises(EventValidationError):
            sink.emit("sim", "call_completed", {})


def test_a_store_the_child_cannot_open_is_the_stores_error_at_construction(
    tmp_path: Path,
) -> None:
    with pytest.raises(StoreURLError):
        StoreEventSink.in_child_process("bogus://nowhere")
    with pytest.raises(StoreError):  # nothing listens there
        StoreEventSink.in_child_process("postgresql+psycopg://postgres@127.0.0.1:9/test")
    assert writer_children(os.getpid()) == []  # no child left behind


@pytest.mark.postgres
def test_the_password_never_reaches_the_childs_command_line(pg_url: str) -> None:
    # trust auth: PostgreSQL ignores the password, the child still opens the store
    url = pg_url.replace("postgres@", "postgres:s3cret-pw@")
    assert "s3cret-pw" in url
    with child_sink(url) as sink:
        (pid,) = writer_children(os.getpid())
        assert b"s3cret-pw" not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert sink.emit("sim", "breaker_changed", GOOD) is None


async def test_a_killed_child_fails_its_batch_typed_and_the_next_batch_starts_a_new_one(
    sqlite_url: str,
) -> None:
    with open_store(sqlite_url) as store, child_sink(sqlite_url) as sink:
        await sink.emit("sim", "breaker_changed", GOOD)  # type: ignore[misc]
        (pid,) = writer_children(os.getpid())
        os.kill(pid, signal.SIGSTOP)  # the next batch is sent, and waits for an answer
        receipt = sink.emit("sim", "breaker_changed", GOOD)
        await asyncio.sleep(0.3)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(EventSinkError, match="may or may not be committed"):
            await receipt  # type: ignore[misc]
        await sink.emit("sim", "breaker_changed", GOOD)  # type: ignore[misc]
        assert writer_children(os.getpid()) != [pid]
        assert len(store.read_stream("llm:sim")) == 2  # the killed one's was never written


def test_ctrl_c_to_the_process_group_leaves_the_child_writing(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store, child_sink(sqlite_url) as sink:
        (pid,) = writer_children(os.getpid())
        os.kill(pid, signal.SIGINT)  # what a terminal's Ctrl-C sends to every process
        time.sleep(0.2)
        assert sink.emit("sim", "breaker_changed", GOOD) is None
        assert writer_children(os.getpid()) == [pid]
        assert len(store.read_stream("llm:sim")) == 1


PRODUCER = textwrap.dedent(
    """
    import os, sys
    from trm_llm import StoreEventSink, sink_process
    sink = StoreEventSink.in_child_process(sys.argv[1])
    good = {"from_state": "closed", "to_state": "open", "failures": 1, "at": 0.0, "call_id": "c"}
    print("pid", os.getpid(), flush=True)
    i = 0
    while True:
        sink.emit("sim", "breaker_changed", {**good, "failures": i})
        print("acked", i, flush=True)
        i += 1
    """
)


@pytest.mark.postgres
def test_a_killed_parent_loses_nothing_acknowledged_and_its_child_exits(store_url: str) -> None:
    producer = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, store_url], stdout=subprocess.PIPE, text=True
    )
    assert producer.stdout is not None
    assert producer.stdout.readline().split()[0] == "pid"
    acked = -1
    for line in producer.stdout:
        acked = int(line.split()[1])
        if acked >= 50:
            break
    (child,) = writer_children(producer.pid)
    producer.kill()
    producer.wait()
    acked = max([acked, *(int(line.split()[1]) for line in producer.stdout)])
    assert gone(child, within_s=30), "the writer outlived its parent"
    with open_store(store_url) as store:
        failures = [e.data["failures"] for e in store.read_stream("llm:sim")]
    assert failures == list(range(len(failures)))  # in order, none twice
    assert len(failures) >= acked + 1  # every acknowledged event is there


# -- what a hostile review found (each failed before the fix) ---------------------------------


class Unreadable:
    """Pickles in the client; unpickling it in the child raises (int("not a number"))."""

    def __reduce__(self) -> tuple[type[int], tuple[str]]:
        return int, ("not a number",)


@pytest.mark.parametrize(
    "poison", [threading.Lock(), Unreadable()], ids=["unpicklable", "unreadable"]
)
async def test_an_event_that_does_not_travel_fails_alone(sqlite_url: str, poison: object) -> None:
    with open_store(sqlite_url) as store, child_sink(sqlite_url) as sink:
        (pid,) = writer_children(os.getpid())
        receipts = [
            sink.emit("sim", "breaker_changed", GOOD),
            sink.emit("sim", "breaker_changed", {**GOOD, "call_id": poison}),
            sink.emit("sim", "breaker_changed", GOOD),
        ]
        outcomes = await asyncio.gather(*(r for r in receipts if r), return_exceptions=True)
        assert outcomes[0] is None and outcomes[2] is None
        assert isinstance(outcomes[1], EventSinkError)
        assert len(store.read_stream("llm:sim")) == 2
        assert writer_children(os.getpid()) == [pid]  # the child did not die of it


async def test_two_closes_at_once_both_wait_for_the_queue(sqlite_url: str) -> None:
    # The second close() returned at once and closed the child under the writer's batch.
    with open_store(sqlite_url) as store:
        sink = StoreEventSink.in_child_process(sqlite_url)
        receipts = [sink.emit("sim", "breaker_changed", GOOD) for _ in range(500)]
        await asyncio.gather(asyncio.to_thread(sink.close), asyncio.to_thread(sink.close))
        await asyncio.gather(*(r for r in receipts if r))  # every one committed
        assert len(store.read_stream("llm:sim")) == 500
        assert writer_children(os.getpid()) == []


def test_a_child_that_died_idle_is_replaced_before_the_next_batch(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store, child_sink(sqlite_url) as sink:
        (pid,) = writer_children(os.getpid())
        os.kill(pid, signal.SIGKILL)
        assert gone(pid, within_s=10)
        assert sink.emit("sim", "breaker_changed", GOOD) is None  # no batch lost to it
        assert len(store.read_stream("llm:sim")) == 1


def test_a_relative_url_is_the_same_store_after_the_client_changes_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    with child_sink("sqlite:///events.db") as sink:
        assert sink.emit("sim", "breaker_changed", GOOD) is None
        (pid,) = writer_children(os.getpid())
        os.kill(pid, signal.SIGKILL)
        assert gone(pid, within_s=10)
        monkeypatch.chdir(tmp_path / "b")
        assert sink.emit("sim", "breaker_changed", GOOD) is None  # a new child, same store
    assert not (tmp_path / "b" / "events.db").exists()
    with open_store(f"sqlite:///{tmp_path / 'a' / 'events.db'}") as store:
        assert len(store.read_stream("llm:sim")) == 2


def test_the_child_imports_nothing_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sqlite_url: str
) -> None:
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "trm_store.py").write_text("raise RuntimeError('the cwd shadowed trm_store')\n")
    monkeypatch.chdir(shadow)
    with child_sink(sqlite_url) as sink:
        assert sink.emit("sim", "breaker_changed", GOOD) is None


def test_the_child_has_a_process_group_of_its_own(sqlite_url: str) -> None:
    # A terminal's Ctrl-C goes to the foreground process group: it must not kill a child
    # that is still importing (before it ignores SIGINT).
    with child_sink(sqlite_url):
        (pid,) = writer_children(os.getpid())
        assert os.getpgid(pid) != os.getpgid(0)


def test_a_forked_client_cannot_use_the_sink_nor_keep_the_child_alive(sqlite_url: str) -> None:
    sink = StoreEventSink.in_child_process(sqlite_url)
    assert sink.emit("sim", "breaker_changed", GOOD) is None
    (child,) = writer_children(os.getpid())
    read, write = os.pipe()
    forked = os.fork()
    if forked == 0:  # the forked copy: a typed error at once, then it lives on with its fds
        signal.alarm(10)  # an emit that blocks ends the fork, and the parent reads EOF
        try:
            sink.emit("sim", "breaker_changed", GOOD)
            os.write(write, b"emitted")
        except EventSinkError:
            os.write(write, b"refused")
        sink.close()  # closes only its copies
        time.sleep(30)
        os._exit(0)
    try:
        os.close(write)
        assert os.read(read, 16) == b"refused"
        started = time.monotonic()
        sink.close()
        assert time.monotonic() - started < 10  # the fork's copy of the socket kept no EOF away
        assert gone(child, within_s=10)
    finally:
        os.kill(forked, signal.SIGKILL)
        os.waitpid(forked, 0)
        os.close(read)


async def test_a_stopped_child_is_killed_after_the_answer_timeout(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sink_process, "ANSWER_TIMEOUT_S", 2)
    with open_store(sqlite_url) as store, child_sink(sqlite_url) as sink:
        (pid,) = writer_children(os.getpid())
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(EventSinkError, match="may or may not be committed"):
            await asyncio.wait_for(sink.emit("sim", "breaker_changed", GOOD), 30)  # type: ignore[arg-type]
        assert gone(pid, within_s=10)
        await sink.emit("sim", "breaker_changed", GOOD)  # type: ignore[misc]
        assert len(store.read_stream("llm:sim")) == 1


async def test_a_child_that_cannot_restart_is_an_event_sink_error(tmp_path: Path) -> None:
    path = tmp_path / "trm.db"
    with child_sink(f"sqlite:///{path}") as sink:
        (pid,) = writer_children(os.getpid())
        os.kill(pid, signal.SIGKILL)
        assert gone(pid, within_s=10)
        for leftover in tmp_path.glob("trm.db*"):
            leftover.unlink()
        path.write_bytes(b"not a database" * 100)
        with pytest.raises(EventSinkError, match="could not restart") as info:
            await sink.emit("sim", "breaker_changed", GOOD)  # type: ignore[misc]
        assert isinstance(info.value.__cause__, StoreError)
