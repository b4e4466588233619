"""PostgreSQL writers keep their connections and begin each transaction in the round trip that
takes the append lock (`trm_store.postgres_writers`): no pre-ping, no `BEGIN` alone, and a kept
connection that died while idle is replaced before anything is written."""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Mapping, Sequence

import psycopg
import pytest
from sqlalchemy import Connection, Table, create_engine, event, text
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DBAPIError

from tests.store.helpers import (
    TOTALS,
    Tableless,
    Totals,
    added,
    in_a_forked_child,
    noted,
    totals,
)
from tests.store.round_trip_proxy import round_trip_proxy
from trm_store import (
    EventIdConflictError,
    NewEvent,
    RecordedEvent,
    StoreError,
    open_store,
    postgres_warm,
)
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


def test_an_append_no_projection_takes_is_one_round_trip_and_two_after_an_idle_while(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`BEGIN`, the lock, the insert and `COMMIT` in one query on a connection used within
    `WARM_FOR`; on one idle for longer, the lock first, then the insert and `COMMIT`
    (`trm_store.postgres_warm`)."""
    with round_trip_proxy(pg_url) as (proxy, url), open_store(url, projections={}) as s:
        s.append("s", [added(1)])
        counted = []
        for n in range(2, 12):
            before = proxy.round_trips
            s.append("s", [added(n)], expected_version=n - 1)
            counted.append(proxy.round_trips - before)
        assert counted == [1] * 10
        monkeypatch.setattr(postgres_warm, "WARM_FOR", 0.05)
        time.sleep(0.1)
        before = proxy.round_trips
        s.append("s", [added(12)], expected_version=11)
        assert proxy.round_trips - before == 2
        assert [e.version for e in s.read_stream("s")] == list(range(1, 13))


def test_an_append_a_projection_takes_is_one_round_trip_per_statement_and_no_more(
    pg_url: str,
) -> None:
    """`BEGIN` with the lock and the heads, the INSERT, the projection's two statements (its
    read and its write), COMMIT: before, the pool's pre-ping, psycopg's lone `BEGIN` and the
    heads' own round trip made three more. (psycopg prepares a statement on its fifth run, which
    costs that append one more: the most common count is the steady one.)"""
    with round_trip_proxy(pg_url) as (proxy, url), open_store(url, projections=TOTALS) as s:
        s.append("s", [added(1)])
        counted = []
        for n in range(2, 12):
            before = proxy.round_trips
            s.append("s", [added(n)])
            counted.append(proxy.round_trips - before)
        assert statistics.mode(counted) == 5, counted
        assert [e.version for e in s.read_stream("s")] == list(range(1, 12))
        assert totals(s) == {"s": (66, 11)}


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


@pytest.mark.parametrize(
    "waiting_event",
    [added(5), noted(5)],
    ids=["statement by statement", "numbered by the database"],
)
@pytest.mark.parametrize("isolation", ["", "serializable", "repeatable%5C%20read"])
def test_an_append_that_waited_for_the_lock_sees_the_append_committed_meanwhile(
    pg_url: str, waiting_event: NewEvent, isolation: str
) -> None:
    """An append reads the heads (statement by statement: an event the projection takes), or
    the database numbers its events (one it does not), in a statement whose snapshot is taken
    once the lock is held, so an append that commits while another waits is seen, not
    overwritten (a stale head would reuse its positions: the insert would fail). Whatever the
    session's default isolation: the writers' transactions are READ COMMITTED."""
    if isolation:
        pg_url += f"%20-cdefault_transaction_isolation%3D{isolation}"
    inserted, go_on = threading.Event(), threading.Event()
    with (
        open_store(pg_url, projections=TOTALS) as first,
        open_store(pg_url, projections=TOTALS) as second,
    ):
        first.append("warm", [added(1)])
        second.append("warm", [added(2)], expected_version=1)
        second.append("warm", [noted(0)])  # its statements prepared

        def hold_the_lock(_c: object, _cur: object, statement: str, *_: object) -> None:
            if statement.startswith("INSERT INTO events"):
                inserted.set()  # rows written, the lock held, not committed
                go_on.wait(10)

        event.listen(first._backend.engine, "after_cursor_execute", hold_the_lock)
        holder = threading.Thread(target=first.append, args=("held", [added(3), added(4)]))
        holder.start()
        assert inserted.wait(10)
        threading.Timer(0.5, go_on.set).start()  # while `second` waits for the lock
        recorded = second.append("waiting", [waiting_event])
        holder.join()
        assert [(e.position, e.version) for e in recorded] == [(6, 1)]
        assert [e.position for e in second.read_all()] == [1, 2, 3, 4, 5, 6]
        assert {s.checkpoint for s in second.projection_status().values()} == {6}
        assert totals(second)["held"] == (7, 2)


def test_a_projection_named_with_quotes_percents_and_backslashes_still_moves(
    pg_url: str,
) -> None:
    """Its name is quoted into the heads' `PREPARE` and the stream id into each `EXECUTE`."""
    odd = "it's 100% \\ odd; --"

    class Odd(Totals):
        name = odd

    with open_store(pg_url, projections={odd: Odd()}) as store:
        for n, stream in enumerate(["a'b", "50%", "back\\slash", "x'); DROP TABLE events; --"]):
            store.append(stream, [added(n)])
        assert {n: s.checkpoint for n, s in store.projection_status().items()} == {odd: 4}
        assert [e.stream_id for e in store.read_all()][-1] == "x'); DROP TABLE events; --"


def test_a_writer_session_that_lost_the_prepared_heads_read_is_replaced_with_no_error(
    pg_url: str,
) -> None:
    """The heads' read is prepared once per writer connection: a session that lost it (a
    `DEALLOCATE ALL`, as a pooler's reset runs) fails before anything is written, and the
    append begins again on a new connection."""
    with open_store(pg_url, projections=TOTALS) as store:
        store.append("s", [added(1)])
        (kept,) = store._backend._writers._kept._idle  # type: ignore[attr-defined]
        kept.dbapi_connection.execute("DEALLOCATE ALL")
        assert [e.position for e in store.append("s", [added(2)])] == [2]
        assert totals(store) == {"s": (3, 2)}
        assert kept.dbapi_connection is None or kept.dbapi_connection.closed


def test_psycopg_deallocates_its_prepared_statements_at_a_rollback(pg_url: str) -> None:
    """Canary: the writers re-prepare the heads' read after a rollback with `DEALLOCATE ALL`,
    which is harmless only because psycopg's rollback leaves it no prepared statement of its
    own (it deallocates them all). If an upgrade changes that, this fails."""
    raw = psycopg.connect(normalise_url(pg_url).replace("postgresql+psycopg", "postgresql"))
    try:
        for _ in range(8):  # psycopg prepares a statement at its fifth run
            raw.execute("SELECT %s::int", (1,))
        count = "SELECT count(*) FROM pg_prepared_statements"
        assert raw.execute(count).fetchone() == (1,)
        raw.rollback()
        assert raw.execute(count).fetchone() == (0,)
    finally:
        raw.close()


def test_a_refused_append_keeps_the_writer_connection_and_its_next_append_works(
    pg_url: str,
) -> None:
    """An append refused by the database rolls back (so psycopg deallocates every prepared
    statement, the heads' read included): the connection is kept, and the next append prepares
    the read again."""
    with round_trip_proxy(pg_url) as (proxy, url), open_store(url, projections=TOTALS) as store:
        taken = store.append("s", [added(1)])[0].event_id
        for n in range(2, 8):  # past psycopg's fifth run: it has statements of its own
            store.append("s", [added(n)])
        opened = proxy.connections
        for n in range(8, 14):
            with pytest.raises(EventIdConflictError):  # the insert fails: a rollback
                store.append("other", [added(n, event_id=taken)])
            store.append("s", [added(n)])
        assert proxy.connections == opened
        assert totals(store) == {"s": (sum(range(1, 14)), 13)}


def test_a_failed_commit_keeps_the_prepared_heads_read_and_the_connection(pg_url: str) -> None:
    """A `COMMIT` that fails (a deferred constraint) rolls back with nothing for psycopg to
    deallocate: the heads' read stays prepared, and the next appends use it on the same
    connection, with no error on the way (a blind re-`PREPARE` would fail, or make psycopg
    deallocate everything again)."""
    errors: list[str] = []
    with round_trip_proxy(pg_url) as (proxy, url), open_store(url, projections=TOTALS) as store:
        with store.write_transaction() as conn:
            conn.exec_driver_sql(
                "CREATE TABLE dom (id int PRIMARY KEY,"
                " parent int REFERENCES dom (id) DEFERRABLE INITIALLY DEFERRED)"
            )
        for n in range(1, 8):  # past psycopg's fifth run: it has statements of its own
            store.append("s", [added(n)])
        opened = proxy.connections
        event.listen(
            store._backend.engine,
            "handle_error",
            lambda context: errors.append(str(context.original_exception)),
        )
        with pytest.raises(StoreError), store.write_transaction() as conn:
            conn.exec_driver_sql("INSERT INTO dom VALUES (1, 42)")  # refused at COMMIT
        for n in range(8, 11):
            store.append("s", [added(n)])
        assert proxy.connections == opened
        assert len(errors) == 1 and "foreign key" in errors[0], errors
        assert totals(store) == {"s": (sum(range(1, 11)), 10)}


def test_a_write_transaction_gets_psycopgs_usual_cursor(pg_url: str) -> None:
    """Only the statement that begins the transaction has its cursor move to the last result
    of several: a caller's own multi-statement query gets the first, as on any connection."""
    with open_store(pg_url, projections={}) as store, store.write_transaction() as conn:
        result = conn.exec_driver_sql("SELECT 1 AS a; SELECT 2 AS b, 3 AS c")
        assert list(result.keys()) == ["a"] and result.all() == [(1,)]


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


class _SwallowsAnError(Tableless):
    """A projection whose `apply` catches a database error of its own (on the append's
    connection) and carries on, for events of amount 13."""

    name = "test_swallows"

    def apply(
        self, conn: Connection, tables: Mapping[str, Table], events: Sequence[RecordedEvent]
    ) -> None:
        if any(e.data["amount"] == 13 for e in events):
            with contextlib.suppress(DBAPIError):
                conn.exec_driver_sql("SELECT 1/0")


def test_an_append_whose_transaction_failed_is_refused_not_acknowledged(pg_url: str) -> None:
    """PostgreSQL ends a transaction at its first error, and answers its COMMIT with a rollback,
    which psycopg does not raise: the append was acknowledged, and lost (review, nineteenth
    session). Now the caller gets a StoreError, and the next append is written."""
    with open_store(pg_url, projections={_SwallowsAnError.name: _SwallowsAnError()}) as store:
        store.append("s", [added(1)])
        with pytest.raises(StoreError, match="error was caught"):
            store.append("s", [added(13)])
        assert [e.data["amount"] for e in store.read_all()] == [1]
        assert [e.position for e in store.append("s", [added(2)])] == [2]
