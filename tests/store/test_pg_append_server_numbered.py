"""An append numbered by the database on PostgreSQL (`trm_store.postgres_append`): the lock's
round trip, then the insert's with its `COMMIT`; the numbers it gives, the plan it runs, any
value coming back as it went; and everything it leaves to the append that goes statement by
statement (a stream moved, an event id taken or chosen, a projection's row to change, a large
append), which then decides exactly as before. When things fail:
`test_pg_append_server_numbered_failures.py`."""

from __future__ import annotations

import string
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import ExceptionContext

from tests.store.helpers import TOTALS, added, noted, totals
from tests.store.round_trip_proxy import round_trip_proxy
from trm_store import (
    ConcurrencyError,
    EventIdConflictError,
    NewEvent,
    open_store,
)
from trm_store.connect import normalise_url
from trm_store.postgres_append import SERVER_NUMBERED_MAX_CHARS
from trm_store.schema import FOLLOWING

pytestmark = pytest.mark.postgres
_ID = "0b5f6a36-6e8e-4d6c-9a47-3f1d2f0c9e11"


def _checkpoints(url: str) -> dict[str, int]:
    engine = create_engine(normalise_url(url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT name, checkpoint FROM projection_state"))
            return {name: checkpoint for name, checkpoint in rows}
    finally:
        engine.dispose()


def test_a_stream_not_at_the_expected_version_is_refused_with_its_version_and_nothing_written(
    pg_url: str,
) -> None:
    with open_store(pg_url, projections={}) as store:
        store.append("s", [noted(1), noted(2)])
        with pytest.raises(ConcurrencyError) as refused:
            store.append("s", [noted(3)], expected_version=1)
        assert (refused.value.expected, refused.value.actual) == (1, 2)
        assert [
            (e.position, e.version) for e in store.append("s", [noted(3)], expected_version=2)
        ] == [(3, 3)]
        assert [e.data["amount"] for e in store.read_all()] == [1, 2, 3]


@pytest.mark.parametrize("expected", [2**31 - 1, 2**31, 2**63 - 1])
def test_an_expected_version_past_the_integers_of_the_column_is_a_conflict(
    pg_url: str, expected: int
) -> None:
    """Refused as a conflict, as statement by statement (an `int` array overflowed: review)."""
    with open_store(pg_url, projections={}) as store:
        store.append("s", [noted(1)])
        with pytest.raises(ConcurrencyError) as refused:
            store.append("s", [noted(2)], expected_version=expected)
        assert (refused.value.expected, refused.value.actual) == (expected, 1)
        assert [e.version for e in store.append("s", [noted(2)], expected_version=1)] == [2]


def test_a_batch_of_streams_is_numbered_per_stream_and_in_order(pg_url: str) -> None:
    with open_store(pg_url, projections={}) as store:
        store.append("b", [noted(0)])
        recorded = store.append_batch(
            [
                ("a", [noted(1), noted(2)], 0),
                ("b", [noted(3)], 1),
                ("a", [noted(4)], 2),
            ]
        )
        assert [(e.stream_id, e.position, e.version) for e in recorded] == [
            ("a", 2, 1),
            ("a", 3, 2),
            ("b", 4, 2),
            ("a", 5, 3),
        ]
        assert list(store.read_all()) == [store.read_stream("b")[0], *recorded]


def test_a_retried_append_returns_the_recorded_events_and_a_reused_id_is_refused(
    pg_url: str,
) -> None:
    """The unique index refuses the insert; the append statement by statement tells a retry
    from another use of the id."""
    with open_store(pg_url, projections={}) as store:
        first = store.append("s", [NewEvent("test.noted", {"amount": 1}, event_id=_ID)])
        again = store.append("s", [NewEvent("test.noted", {"amount": 1}, event_id=_ID)])
        assert again == first
        with pytest.raises(EventIdConflictError):
            store.append("t", [NewEvent("test.noted", {"amount": 2}, event_id=_ID)])
        assert [e.position for e in store.read_all()] == [1]
        assert [e.position for e in store.append("t", [noted(3)])] == [2]


def test_a_retry_with_the_callers_ids_never_fails_the_query_that_holds_its_values(
    pg_url: str,
) -> None:
    """An append whose caller chose its ids goes statement by statement: a retry's refusal by
    the unique index is then an error on a bound parameter, not on a query holding every value
    of the append, which PostgreSQL would log whole at its default `log_min_error_statement`
    (review)."""
    marker = "a-value-no-log-should-hold"
    event = NewEvent("test.noted", {"amount": 1, "note": marker}, event_id=_ID)
    with open_store(pg_url, projections={}) as store:
        first = store.append("s", [event])
        failed: list[str] = []

        @event_listens(store)
        def _seen(context: ExceptionContext) -> None:
            failed.append(context.statement or "")

        assert store.append("s", [event]) == first
        with pytest.raises(EventIdConflictError):
            store.append("t", [NewEvent("test.noted", {"amount": 2, "note": marker}, event_id=_ID)])
        assert failed  # the statement-by-statement insert's refusals
        assert not any(marker in statement for statement in failed), failed


def test_a_following_row_of_another_code_is_set_to_the_head_by_an_append_it_does_not_take(
    pg_url: str,
) -> None:
    """A store that does not run `test_totals` appends: the projection's row must leave the log
    (the append statement by statement sets it to the head), and the next open catches it up."""
    with open_store(pg_url, projections=TOTALS) as with_totals:
        with_totals.append("s", [added(1)])
    assert _checkpoints(pg_url) == {"test_totals": FOLLOWING}
    with open_store(pg_url, projections={}) as without:
        without.append("s", [added(2)])
        assert _checkpoints(pg_url) == {"test_totals": 1}
        without.append("s", [added(3)])  # numbered by the database: nothing left to change
        assert _checkpoints(pg_url) == {"test_totals": 1}
    with open_store(pg_url, projections=TOTALS) as again:
        assert totals(again) == {"s": (6, 3)}


def test_a_projection_of_this_code_at_the_head_starts_to_follow_on_an_append_it_does_not_take(
    pg_url: str,
) -> None:
    with open_store(pg_url, projections=TOTALS) as store:
        store.append("s", [added(1)])
    with open_store(pg_url, projections={}) as without:
        without.append("s", [noted(2)])  # the row is set to the head: 1
    with open_store(pg_url, projections=TOTALS) as store:
        assert _checkpoints(pg_url) == {"test_totals": 2}  # caught up on open, not following
        store.append("s", [noted(3)])
        assert _checkpoints(pg_url) == {"test_totals": FOLLOWING}
        store.append("s", [added(4)])
        assert totals(store) == {"s": (5, 2)}


def test_the_insert_runs_its_generic_plan_which_reads_the_indexes(pg_url: str) -> None:
    """Not planned anew at each run (600 custom plans in 600 runs before: ~300 us an append,
    under the lock); the generic plan, made when the log was small, finds the head and each
    stream's version by index and reads no table of the log's size whole."""
    with open_store(pg_url, projections={}) as store:
        for n in range(8):
            store.append("s", [noted(n)])
        (kept,) = store._backend._writers._kept._idle  # type: ignore[attr-defined]
        raw = kept.dbapi_connection
        plans = "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = %s"
        assert raw.execute(plans, ("trm_append_rows",)).fetchone() == (8, 0)
        raw.execute("SET plan_cache_mode = force_generic_plan")
        try:
            plan = "\n".join(
                row[0]
                for row in raw.execute(
                    "EXPLAIN (COSTS OFF) EXECUTE trm_append_rows"
                    "('{}', '{}', '{}', '{}', '{}', '{}', now(), '{}', '{}', '{}', '{}')"
                )
            )
        finally:
            raw.execute("RESET plan_cache_mode")
        assert "Index Only Scan Backward using events_pkey" in plan, plan
        # Nothing reads the whole log: a check of chosen ids did, an append (review of 4978a60).
        assert "Seq Scan on events" not in plan, plan
        assert "Index Only Scan Backward using uq_events_stream_version" in plan, plan


def test_an_append_larger_than_a_query_should_carry_goes_as_copy(pg_url: str) -> None:
    big = "x" * 1000
    events = [NewEvent("test.noted", {"amount": n, "note": big}) for n in range(1100)]
    with round_trip_proxy(pg_url) as (proxy, url), open_store(url, projections={}) as store:
        store.append("warm", [noted(0)])
        before = proxy.round_trips
        recorded = store.append("s", events)
        assert proxy.round_trips - before > 1  # lock and heads, COPY (two), COMMIT
        assert sum(len(e.data["note"]) for e in recorded) > SERVER_NUMBERED_MAX_CHARS
        assert [e.version for e in store.read_stream("s")] == list(range(1, 1101))


def test_the_insert_is_quoted_before_the_lock_is_asked_for(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The insert's values are quoted into its query while the append waits for the lock, not
    once it holds it: quoting a 50-event append's values took ~33 us of every writer's turn."""
    quoted: list[str] = []
    mogrify = psycopg.ClientCursor.mogrify

    def spy(cursor: psycopg.ClientCursor[Any], query: Any, params: Any = None) -> str:
        quoted.append(str(query))
        return mogrify(cursor, query, params)

    monkeypatch.setattr(psycopg.ClientCursor, "mogrify", spy)
    with open_store(pg_url, projections={}) as holder, open_store(pg_url, projections={}) as store:
        store.append("warm", [noted(0)])
        quoted.clear()
        with holder.write_transaction() as conn:  # the append lock, held
            # A session blocked by this one (not any lock of the server's other sessions).
            waiting = (
                "SELECT count(*) FROM pg_locks WHERE NOT granted"
                f" AND {conn.exec_driver_sql('SELECT pg_backend_pid()').scalar_one()}"
                " = ANY(pg_blocking_pids(pid))"
            )
            writer = threading.Thread(
                target=store.append, args=("s", [noted(n) for n in range(50)])
            )
            writer.start()
            deadline = time.monotonic() + 20
            while conn.exec_driver_sql(waiting).scalar_one() == 0:
                assert time.monotonic() < deadline, "the append never waited for the lock"
                time.sleep(0.01)
            assert any("trm_append_rows" in q for q in quoted), quoted
        writer.join(20)
        assert store.stream_version("s") == 50


def test_writers_in_threads_each_get_their_own_numbers(pg_url: str) -> None:
    """Grouped appends of 8 threads (`trm_store.append_queue`), each stream its own."""
    with open_store(pg_url, projections={}) as store:
        start = threading.Barrier(8)

        def write(k: int) -> None:
            start.wait()
            for n in range(25):
                store.append(f"s{k}", [noted(n), noted(n)], expected_version=2 * n)

        threads = [threading.Thread(target=write, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        log = list(store.read_all())
        assert [e.position for e in log] == list(range(1, 401))
        for k in range(8):
            assert [e.version for e in store.read_stream(f"s{k}")] == list(range(1, 51))


_TEXT = st.text(
    alphabet=st.sampled_from(string.printable + "{}\"\\'%,NULL é中\u2028"), min_size=1, max_size=20
).filter(lambda s: not s.isspace())


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(streams=st.lists(_TEXT, min_size=1, max_size=4), notes=st.lists(_TEXT, max_size=4))
def test_any_stream_ids_and_values_come_back_exactly(
    pg_url: str, streams: list[str], notes: list[str]
) -> None:
    """Quotes, backslashes, braces, commas, `%`, `NULL`, non-ASCII: every value travels as an
    array literal's element, quoted into the query; each comes back as it was given."""
    with open_store(pg_url, projections={}) as store:
        before = store.head_position()
        items = [
            (
                stream,
                [NewEvent("test.noted", {"amount": n, "note": note}) for note in notes or ["-"]],
            )
            for n, stream in enumerate(dict.fromkeys(streams))
        ]
        recorded = store.append_batch([(stream, events, None) for stream, events in items])
        read = list(store.read_all(after_position=before))
        assert read == recorded
        assert [(e.stream_id, e.data) for e in read] == [
            (stream, {"amount": n, "note": e.data["note"]})
            for n, (stream, events) in enumerate(items)
            for e in events
        ]
        assert [e.data["note"] for e in read] == [e.data["note"] for _, es in items for e in es]


def event_listens(store: object) -> Callable[[Callable[[ExceptionContext], None]], object]:
    """Decorate a `handle_error` listener of the store's engine."""
    return lambda listener: event.listen(
        store._backend.engine,  # type: ignore[attr-defined]
        "handle_error",
        listener,
    )
