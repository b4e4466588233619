"""The SQLite backend's per-thread writer connections: reused, bounded, fork-safe, never nested."""

from __future__ import annotations

import os
import threading

import pytest
from pydantic import BaseModel
from sqlalchemy import Connection

from trm_store import NewEvent, Store, StoreError, open_store, register_event_type
from trm_store.sqlite import SqliteBackend


class Ping(BaseModel):
    n: int


register_event_type("test.ping", Ping)


def ping(n: int) -> list[NewEvent]:
    return [NewEvent("test.ping", {"n": n})]


def writers(store: Store) -> dict[threading.Thread, Connection]:
    backend = store._backend
    assert isinstance(backend, SqliteBackend)
    return backend._writers._by_thread


def test_a_thread_reuses_its_connection_across_appends(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store:
        store.append("s", ping(1))
        first = writers(store)[threading.current_thread()]
        store.append("s", ping(2))
        assert writers(store)[threading.current_thread()] is first
        assert [e.data["n"] for e in store.read_stream("s")] == [1, 2]


def test_connections_of_ended_threads_are_closed(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store:
        store.append("main", ping(0))
        opened = []
        for n in range(5):
            worker = threading.Thread(target=store.append, args=(f"t{n}", ping(n)))
            worker.start()
            worker.join()
            opened.append(writers(store)[worker])
        # Each new thread closes the connections of those that ended before it: the number kept
        # is bounded by the live threads (plus the last one that ended).
        assert set(writers(store)) <= {threading.current_thread(), worker}
        assert all(conn.closed for conn in opened[:-1])
        assert store.head_position() == 6


def test_threads_append_concurrently_each_on_its_own_connection(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store:
        seen: dict[str, Connection] = {}

        def work(name: str) -> None:
            for n in range(50):
                store.append(name, ping(n))
            seen[name] = writers(store)[threading.current_thread()]

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
        parent_conn = writers(store)[threading.current_thread()]
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: append through the inherited store, report, exit at once
            code = 1
            try:
                if child_closes_first:  # must leave the parent's connection alone
                    store.close()
                store.append("s", ping(2))
                mine = writers(store)[threading.current_thread()]
                code = 0 if mine is not parent_conn and not parent_conn.closed else 2
            finally:
                os.write(write, bytes([code]))
                os._exit(0)
        os.close(write)
        child_code = os.read(read, 1)
        os.waitpid(pid, 0)
        assert child_code == bytes([0])
        store.append("s", ping(3))
        assert writers(store)[threading.current_thread()] is parent_conn
        assert not parent_conn.closed
        assert [e.data["n"] for e in store.read_stream("s")] == [1, 2, 3]


def test_close_closes_the_writer_connections_and_a_later_write_reopens(sqlite_url: str) -> None:
    store = open_store(sqlite_url)
    store.append("s", ping(1))
    conn = writers(store)[threading.current_thread()]
    store.close()
    assert conn.closed
    store.append("s", ping(2))
    assert store.head_position() == 2
    store.close()
