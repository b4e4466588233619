"""PostgreSQL writers keep their connections and begin each transaction in the round trip that
takes the append lock (`trm_store.postgres_writers`): no pre-ping, no `BEGIN` alone, and a kept
connection that died while idle is replaced before anything is written."""

from __future__ import annotations

import statistics
import threading
import time

import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import ExceptionContext

from tests.store.helpers import TOTALS, added, in_a_forked_child, totals
from tests.store.round_trip_proxy import round_trip_proxy
from trm_store import open_store
from trm_store.connect import normalise_url
from trm_store.postgres import WRITER_SLOTS

pytestmark = pytest.mark.postgres


def _terminate_idle_backends(url: str) -> int:
    """Kill every idle backend of this database but the caller's; how many."""
    admin = create_engine(normalise_url(url))
    try:
        with admin.begin() as conn:
            return len(
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                        " AND state = 'idle' AND application_name = 'trm-writer-test'"
                    )
                ).all()
            )
    finally:
        admin.dispose()


def test_an_append_takes_one_round_trip_per_statement_and_no_more(pg_url: str) -> None:
    """`BEGIN` with the lock, the heads, the INSERT, COMMIT: before, the pool's pre-ping and
    psycopg's lone `BEGIN` made six. (psycopg prepares a statement on its fifth run, which costs
    that append one more: the most common count is the steady one.)"""
    with round_trip_proxy(pg_url) as (proxy, url), open_store(url, projections={}) as s:
        s.append("s", [added(1)])
        counted = []
        for n in range(2, 12):
            before = proxy.round_trips
            s.append("s", [added(n)])
            counted.append(proxy.round_trips - before)
        assert statistics.mode(counted) == 4, counted
        assert [e.version for e in s.read_stream("s")] == list(range(1, 12))


def test_a_writer_connection_killed_while_idle_is_replaced_before_anything_is_written(
    pg_url: str,
) -> None:
    url = pg_url + "&application_name=trm-writer-test"
    with open_store(url, projections=TOTALS) as store:
        store.append("s", [added(1)])
        disconnects: list[bool] = []

        @event.listens_for(store._backend.engine, "handle_error")
        def _seen(context: ExceptionContext) -> None:
            disconnects.append(context.is_disconnect)

        assert _terminate_idle_backends(url) >= 1
        [second] = store.append("s", [added(2)])  # no error reaches the caller
        [third] = store.append("s", [added(3)])
        assert disconnects == [True]  # the kept connection's death was seen, once
        assert (second.position, third.position) == (2, 3)
        assert totals(store) == {"s": (6, 3)}


def test_writers_hold_at_most_their_slots_of_connections_and_close_them(pg_url: str) -> None:
    with round_trip_proxy(pg_url) as (proxy, url):
        store = open_store(url, projections=TOTALS)
        start = threading.Barrier(16)

        def write(k: int) -> None:
            start.wait()
            for n in range(20):
                store.append(f"s{k}", [added(n)])

        threads = [threading.Thread(target=write, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        opened = proxy.connections
        assert totals(store) == {f"s{k}": (190, 20) for k in range(16)}
        store.close()
        # The writers' connections, and the pool's for the reads (bootstrap's and totals').
        assert opened <= WRITER_SLOTS + 2
        for _ in range(100):  # the proxy sees each close a moment later
            if proxy.open_connections == 0:
                break
            time.sleep(0.02)
        assert proxy.open_connections == 0


def test_a_forked_child_writes_on_connections_of_its_own(pg_url: str) -> None:
    with round_trip_proxy(pg_url) as (proxy, url), open_store(url, projections=TOTALS) as store:
        store.append("s", [added(1)])
        before = proxy.connections

        def child() -> bytes:
            [event_] = store.append("s", [added(2)])
            return str(event_.position).encode()

        assert in_a_forked_child(child) == b"2"
        assert proxy.connections > before  # the child opened its own
        [third] = store.append("s", [added(3)])  # the parent's kept connection still works
        assert third.position == 3
        assert totals(store) == {"s": (6, 3)}


def test_the_checkpoints_move_in_the_heads_read_and_every_round_trip_is_a_statement(
    pg_url: str,
) -> None:
    """With a projection to move, an append sends no checkpoint `UPDATE` of its own (the heads'
    read moves the checkpoints), and its round trips are its statements and `COMMIT`."""
    with round_trip_proxy(pg_url) as (proxy, url), open_store(url, projections=TOTALS) as store:
        store.append("s", [added(1)])
        sent: list[str] = []
        event.listen(
            store._backend.engine,
            "before_cursor_execute",
            lambda _c, _cur, statement, *_: sent.append(statement),
        )
        beyond_statements = []
        for n in range(2, 12):
            sent.clear()
            before = proxy.round_trips
            store.append("s", [added(n)])
            beyond_statements.append(proxy.round_trips - before - len(sent))
            assert not [s for s in sent if s.startswith("UPDATE projection_state")], sent
        # COMMIT (and, on the fifth run of each statement, psycopg preparing it).
        assert statistics.mode(beyond_statements) == 1, beyond_statements
        assert {s.checkpoint for s in store.projection_status().values()} == {11}
        assert totals(store) == {"s": (66, 11)}


class _Alarm(Exception):
    """What a timeout's signal handler raises: not one psycopg cancels the query for."""


class _HardAlarm(BaseException):
    """A BaseException from a signal handler: SQLAlchemy invalidates the connection."""


def _another_store_appends(url: str, within: float) -> bool:
    """Whether a second store (as another process's would) gets the append lock in time."""
    done = threading.Event()

    def write() -> None:
        with open_store(url, projections=TOTALS) as other:
            other.append("other", [added(1)])
        done.set()

    threading.Thread(target=write, daemon=True).start()
    return done.wait(within)


@pytest.mark.parametrize("raised", [_Alarm, _HardAlarm])
def test_a_transaction_interrupted_mid_statement_never_keeps_the_append_lock(
    pg_url: str, raised: type[BaseException]
) -> None:
    """Before: an `Exception` from a signal handler left the busy connection on the idle list,
    its transaction open with the lock held (every writer of every process waited forever);
    a `BaseException` left it invalidated but unclosed until the garbage collector ran."""
    import gc
    import signal

    def alarm(*_: object) -> None:
        raise raised("timed out")

    previous = signal.signal(signal.SIGALRM, alarm)
    gc.disable()  # as the benches run: nothing may depend on a collection to free the lock
    try:
        with open_store(pg_url, projections=TOTALS) as store:
            store.append("s", [added(1)])
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            with pytest.raises(raised), store.write_transaction() as conn:
                conn.exec_driver_sql("SELECT pg_sleep(2)")
            signal.setitimer(signal.ITIMER_REAL, 0)
            assert _another_store_appends(pg_url, within=5.0)
            [second] = store.append("s", [added(2)])
            assert second.position == 3  # after the other store's
            assert totals(store)["s"] == (3, 2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        gc.enable()
