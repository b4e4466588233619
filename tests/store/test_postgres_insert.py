"""An append's rows reach PostgreSQL with its `COMMIT` (`trm_store.postgres_insert`): one JSON
document quoted into a simple query, below `WITH_COMMIT_BELOW` rows; a `COPY` from there.

What must hold whichever way they went: the log stores each event's JSON text exactly as the store
serialised it (byte for byte: the document carries it as a JSON string, the server unescapes it),
and every other column as given, whatever the text holds (quotes, backslashes, `%`, escapes that
mean something to JSON, to SQL literals or to psycopg's placeholders, non-ASCII); and an insert
that fails commits nothing, leaves the writer's connection usable and the next append correct.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, JsonValue
from sqlalchemy import event, text

from tests.store.helpers import TOTALS, added, totals
from trm_store import EventIdConflictError, NewEvent, Store, open_store, register_event_type
from trm_store.postgres_insert import WITH_COMMIT_BELOW

pytestmark = pytest.mark.postgres


class FreeForm(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: JsonValue
    k: int


register_event_type("test.free_form", FreeForm)

ODD = ["'", "''", "\\", "\\'", '"', '\\"', "%", "%s", "%(rows)s", "$1", "\\u0000", "\\n", "é✓🙂"]
"""Text that means something to a SQL literal, to JSON, to psycopg's client-side binding or to
PostgreSQL's parameters; and non-ASCII text (escaped in the log's JSON, raw in a stream id)."""

odd_text = st.lists(
    st.sampled_from(ODD)
    | st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=3),
    max_size=4,
).map("".join)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([-0.0, 1.0, 1e16, 1e300])
    | odd_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(odd_text, inner, max_size=3),
    max_leaves=6,
)
"""Free-form JSON (no NUL and no lone surrogate: the store refuses them before any database;
event ids are UUIDs, so the odd text goes into stream ids, data and meta)."""


def _stored(store: Store, first: int, last: int) -> list[tuple[Any, ...]]:
    with store._backend.engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                text(
                    "SELECT position, event_id, stream_id, stream_version, type, schema_version,"
                    " data::text, meta::text, recorded_at FROM events"
                    " WHERE position BETWEEN :first AND :last ORDER BY position"
                ),
                {"first": first, "last": last},
            )
        ]


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    size=st.sampled_from([1, 2, WITH_COMMIT_BELOW - 1, WITH_COMMIT_BELOW]),
    stream_tail=odd_text,
    data=st.lists(json_values, min_size=1, max_size=3),
    meta=st.dictionaries(odd_text, json_values, max_size=2),
)
def test_the_log_stores_every_column_exactly_as_the_store_serialised_it(
    pg_url: str, size: int, stream_tail: str, data: list[Any], meta: dict[str, Any]
) -> None:
    with open_store(pg_url, projections={}) as store:
        stream = f"s{uuid.uuid4().hex[:6]}{stream_tail}"
        events = [
            NewEvent(
                "test.free_form",
                {"value": data[k % len(data)], "k": k},
                meta=meta,
                event_id=str(uuid.uuid4()) if k % 2 else None,  # the caller's, or drawn
            )
            for k in range(size)
        ]
        prepared = [store.prepare(e) for e in events]
        recorded = store.append_prepared(stream, prepared)
        stored = _stored(store, recorded[0].position, recorded[-1].position)
        assert stored == [
            (
                e.position,
                e.event_id,
                stream,
                e.version,
                "test.free_form",
                1,
                p.data_json,
                p.meta_json,
                e.recorded_at,
            )
            for e, p in zip(recorded, prepared, strict=True)
        ]
        assert list(store.read_stream(stream)) == recorded


def test_an_insert_refused_with_its_commit_writes_nothing_and_the_next_append_is_whole(
    pg_url: str,
) -> None:
    """The id taken is found by the insert, in the query that carries the `COMMIT`: PostgreSQL
    stops at the insert, so nothing commits; the transaction is rolled back, the connection
    kept, and the next appends (a retry among them) take the next positions."""
    with open_store(pg_url, projections=TOTALS) as store:
        (taken,) = store.append("owner", [added(1)])
        with pytest.raises(EventIdConflictError):
            store.append("other", [added(2), added(3, event_id=taken.event_id)])
        assert store.head_position() == 1
        assert store.stream_version("other") == 0
        assert store.append("owner", [added(1, event_id=taken.event_id)]) == [taken]  # a retry
        [second] = store.append("other", [added(2)])
        assert (second.position, second.version) == (2, 1)
        assert totals(store) == {"owner": (1, 1), "other": (2, 1)}


def test_fresh_ids_send_the_rows_last_with_the_commit_and_a_possible_retry_first_without(
    pg_url: str,
) -> None:
    """The rows carry the COMMIT only after the projections' statements; an append whose ids the
    caller chose may be a retry, so its rows go first, for the log's index to refuse a recorded
    id before a projection's own key could (`test_what_is_written.py` has one keyed by it)."""
    with open_store(pg_url, projections=TOTALS) as store:
        store.append("warm", [added(0)])
        sent: list[tuple[str, bool]] = []  # (the statement's name, whether it commits)
        event.listen(
            store._backend.engine,
            "before_cursor_execute",
            lambda _c, _cur, sql, *_: sent.append(
                (sql.split("(")[0].split()[-1], sql.endswith("; COMMIT"))
            ),
        )
        store.append("fresh", [added(1)])
        fresh, sent[:] = list(sent), []
        store.append("chosen", [added(2, event_id=str(uuid.uuid4()))])
        assert fresh[-1] == ("trm_insert_events", True) and len(fresh) > 2
        assert not any(commits for _, commits in fresh[:-1])
        assert sent == [fresh[0], ("trm_insert_events", False), *fresh[1:-1]]
