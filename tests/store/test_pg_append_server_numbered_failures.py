"""An append numbered by the database on PostgreSQL (`trm_store.postgres_append`) when things
fail: a connection dead while idle (the server's goodbye, or a NAT's silence), a session that lost
the prepared statements, an interrupt or a lost connection once the insert and its `COMMIT` have
left (the outcome unknown, and said so; a group's callers each told the truth). A writer gone
while its append waits for the lock: `test_pg_append_gone_writers.py`."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import event
from sqlalchemy.engine import ExceptionContext

from tests.store.helpers import noted, writing_held
from tests.store.pg_lock_helpers import admin, wait_for
from tests.store.round_trip_proxy import round_trip_proxy
from trm_store import (
    NewEvent,
    StoreError,
    open_store,
    postgres_warm,
)

pytestmark = pytest.mark.postgres


def test_a_kept_connection_killed_while_idle_is_replaced_before_anything_is_written(
    pg_url: str,
) -> None:
    url = pg_url + "&application_name=trm-numbered-test"
    with open_store(url, projections={}) as store:
        store.append("s", [noted(1)])
        disconnects: list[bool] = []

        @event.listens_for(store._backend.engine, "handle_error")
        def _seen(context: ExceptionContext) -> None:
            disconnects.append(context.is_disconnect)

        killed = admin(
            pg_url,
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
            " WHERE application_name = 'trm-numbered-test' AND state = 'idle'"
            " AND query LIKE '%EXECUTE trm_append_rows(%'",  # the writer's, not the pool's
        )
        assert len(killed) == 1
        assert [e.position for e in store.append("s", [noted(2)])] == [2]
        assert disconnects == [True]  # seen at the lock's query, before anything was written
        assert [e.version for e in store.read_stream("s")] == [1, 2]


def test_a_kept_connection_the_network_dropped_silently_is_replaced_with_no_error(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No goodbye from the server (a NAT's idle timeout, which comes after the connection has
    been idle for longer than `WARM_FOR`): the lock, in a query of its own, meets a reset, with
    nothing written, and the append begins again on a new connection (review)."""
    monkeypatch.setattr(postgres_warm, "WARM_FOR", 0.05)
    with round_trip_proxy(pg_url) as (proxy, url), open_store(url, projections={}) as store:
        store.append("s", [noted(1)])
        time.sleep(0.1)
        proxy.forget_flows()
        assert [(e.position, e.version) for e in store.append("s", [noted(2)])] == [(2, 2)]
    with open_store(pg_url, projections={}) as store:
        assert [e.data["amount"] for e in store.read_all()] == [1, 2]


def test_a_connection_the_network_dropped_within_warm_for_is_an_unknown_outcome_said_so(
    pg_url: str,
) -> None:
    """A flow dropped silently right after its last use: the whole append had left in one
    query, so the caller is told it may have been written (here it was not), and the next
    append writes on a new connection."""
    with round_trip_proxy(pg_url) as (proxy, url), open_store(url, projections={}) as store:
        store.append("s", [noted(1)])
        proxy.forget_flows()
        with pytest.raises(StoreError, match="with an append in flight, which may have been"):
            store.append("s", [noted(2)])
        assert [(e.position, e.version) for e in store.append("s", [noted(3)])] == [(2, 2)]


def test_a_session_that_lost_the_prepared_insert_is_replaced_with_no_error(pg_url: str) -> None:
    """A `DEALLOCATE ALL` (a pooler's reset) makes the lock's `EXECUTE` fail, with nothing
    written: the append begins again on a new connection."""
    with open_store(pg_url, projections={}) as store:
        store.append("s", [noted(1)])
        (kept,) = store._backend._writers._kept._idle  # type: ignore[attr-defined]
        kept.dbapi_connection.execute("DEALLOCATE ALL")
        assert [e.position for e in store.append("s", [noted(2)])] == [2]
        assert [e.version for e in store.read_stream("s")] == [1, 2]


def test_an_interrupt_once_the_insert_left_says_the_append_may_have_been_written(
    pg_url: str,
) -> None:
    """An exception raised (as by a signal handler) once the insert and its `COMMIT` had left:
    the caller gets it, with a note that the append may have been written; here it was."""
    with open_store(pg_url, projections={}) as store:
        store.append("s", [noted(1)])
        _interrupt_after_the_insert(store)
        with pytest.raises(TimeoutError) as interrupted:
            store.append("s", [noted(2)])
        assert any("may have been written" in note for note in interrupted.value.__notes__)
        assert [e.data["amount"] for e in store.read_all()] == [1, 2]


def test_a_group_whose_writer_was_interrupted_once_its_commit_left_tells_each_its_outcome(
    pg_url: str,
) -> None:
    """Four appends written as one group, its writer interrupted once the insert and `COMMIT`
    had left (they committed): the writer's caller gets the interrupt, as a handler's error
    reaches the thread it interrupted (`trm_store.handler_raised`); the three others are
    written one by one again, each finds its stream moved, looks itself up in the log and
    returns its recorded events; none is refused or written twice (each was told
    `ConcurrencyError ... nothing was written`: review)."""
    with open_store(pg_url, projections={}) as store:
        for n in range(4):
            store.append(f"v{n}", [noted(0)])
        _interrupt_after_the_insert(store)
        outcomes: dict[int, object] = {}

        def append(n: int) -> None:
            try:
                outcomes[n] = store.append(f"v{n}", [noted(1)], expected_version=1)
            except Exception as e:
                outcomes[n] = e

        queue = store._appends  # type: ignore[attr-defined]
        threads = [threading.Thread(target=append, args=(n,)) for n in range(4)]
        with writing_held(queue):  # all four queue behind it, and go as one group
            for thread in threads:
                thread.start()
            for _ in range(500):
                if len(queue._queued) == 4:
                    break
                time.sleep(0.01)
        for thread in threads:
            thread.join(10)
        log = list(store.read_all())
        assert sorted((e.stream_id, e.version) for e in log[4:]) == [(f"v{n}", 2) for n in range(4)]
        interrupted = [n for n in range(4) if isinstance(outcomes[n], TimeoutError)]
        assert len(interrupted) == 1, outcomes  # the group's writer
        for n in set(range(4)) - set(interrupted):
            recorded = outcomes[n]
            assert isinstance(recorded, list), recorded
            assert [(e.stream_id, e.version) for e in recorded] == [(f"v{n}", 2)]
            assert recorded[0] in log


def test_a_connection_lost_once_the_insert_left_is_the_callers_error_and_keeps_no_values(
    pg_url: str,
) -> None:
    """The insert is slowed by a trigger and its backend killed while it runs: the append's
    outcome is unknown to it (its `COMMIT` had left), so the StoreError says it may have been
    written, and its chain carries no copy of the query (every value of the append)."""
    secret = "do-not-echo-" + "q" * 64
    with open_store(pg_url, projections={}) as store:
        store.append("s", [noted(1)])
        admin(
            pg_url,
            "CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM pg_sleep(30); RETURN NEW; END $$;"
            " CREATE TRIGGER slow BEFORE INSERT ON events FOR EACH ROW"
            " WHEN (NEW.stream_id = 'slow') EXECUTE FUNCTION slow_insert()",
        )
        outcome: list[BaseException] = []

        def append() -> None:
            try:
                store.append("slow", [NewEvent("test.noted", {"amount": 2, "note": secret})])
            except BaseException as e:
                outcome.append(e)

        waiting = threading.Thread(target=append)
        waiting.start()
        assert wait_for(pg_url, "query LIKE '%EXECUTE trm_append_rows(%' AND state = 'active'")
        admin(
            pg_url,
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity"
            " WHERE query LIKE '%EXECUTE trm_append_rows(%' AND state = 'active'"
            " AND pid <> pg_backend_pid()",
        )
        waiting.join(10)
        [error] = outcome
        assert isinstance(error, StoreError)
        assert "with an append in flight, which may have been written" in str(error)
        chain = []
        cause: BaseException | None = error
        while cause is not None:
            chain.append(str(cause))
            cause = cause.__cause__ or cause.__context__
        assert not any(secret in message for message in chain), chain
        assert [e.data["amount"] for e in store.read_all()] == [1]
        assert [e.version for e in store.append("s", [noted(3)])] == [2]


def _interrupt_after_the_insert(store: object) -> None:
    """Raise TimeoutError, as a signal handler would, once the next insert query has run."""
    fired: list[bool] = []

    def interrupt(_c: object, _cur: object, statement: str, *_: object) -> None:
        if "EXECUTE trm_append_rows(" in statement and not fired:
            fired.append(True)
            raise TimeoutError("a signal handler's, once the COMMIT had left")

    event.listen(store._backend.engine, "after_cursor_execute", interrupt)  # type: ignore[attr-defined]
