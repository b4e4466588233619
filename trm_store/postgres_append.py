"""An append numbered by the database on PostgreSQL, in one query (`BEGIN`, the append lock, the
insert, `COMMIT`), the client's work all done before the lock is asked for; in two on a writer
connection that is not warm (`trm_store.postgres_warm`): the lock's, then the rest.

Why: writers queue for the append lock, and an append holds it from its grant to its commit.
Statement by statement, an append holds it across three round trips to its client (the heads
read, the `COPY`, the `COMMIT`) and the client's Python between them: numbering the events,
building the rows (50-event appends, one writer: 1.8 ms of the 2.3 ms the transaction takes).
Here the insert is ready before the lock is asked for, and the server numbers the events: the
lock is held for the server's own work (in two queries, also for one turn of the client).

A caller gone while the query waits for the lock writes nothing: the server checks its client's
socket, and an interrupted caller cancels (`trm_store.postgres_warm`). The insert is one simple
query (no parameters: its values are quoted into it by psycopg's
client-side binding), `EXECUTE trm_append_rows(...); COMMIT`; the statement, after the lock's,
takes its own snapshot at READ COMMITTED, so it sees every append committed before the lock was
granted. The events' columns travel as array literals, one a column, which the prepared
statement unnests (a JSON text is one escaped array element: ASCII, no NUL,
`trm_store.json_codec`), and it numbers them from the log's head and each stream's version as
`trm_store.append` does (the client gives each event's rank among its stream's events).

It inserts nothing (and the caller appends statement by statement, `trm_store.append`, which
decides each append alone) when a stream is not at an append's expected version, or when a
projection would have to act in the append: one of this code's at the head, which starts to
follow the log, or one that follows it but is not this code's, which is set to the head. Any
error of the insert rolls back with nothing written, and the caller goes statement by statement
too. PostgreSQL logs a failed query whole, values included, at its default
`log_min_error_statement`, so the usual refusals are kept out of errors: a stream's version and
the projections' rows refuse by inserting nothing, and appends whose caller chose event ids
(which may be retries, refused by the unique index) go statement by statement from the start.
Checking those ids in the insert cost a sequential scan of the log an append: the generic plan,
made when the log was small, kept it (`bench/README.md`, twenty-third session). Its caller
never sends it events that a projection of this code takes (applied in the append's
transaction, in Python), nor appends larger than `SERVER_NUMBERED_MAX_CHARS` (a query text is
held whole by both sides; a `COPY` streams).

`recorded_at` is the client's clock when the append asks for the lock (the statement-by-statement
append reads it once the lock is granted): the two differ by the wait for the lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from trm_store.postgres_prepared import Prepared
from trm_store.prepared import PreparedAppend
from trm_store.schema import FOLLOWING

__all__ = ["APPEND_ROWS", "SERVER_NUMBERED_MAX_CHARS", "json_size", "numbered_insert"]

SERVER_NUMBERED_MAX_CHARS = 1 << 20
"""The most characters of JSON an append sends in one query; a larger one goes as `COPY`, whose
rows are streamed (the round trips it saves are then a small part of its time)."""

APPEND_ROWS = Prepared(
    "trm_append_rows",
    # The events' data and meta last: an idle writer's last query, in `pg_stat_activity`, shows
    # its first 1 KiB (`track_activity_query_size`), ids and streams before any value.
    "PREPARE trm_append_rows(text[], text[], text[], int[], bigint[], int[], timestamptz,"
    " text[], int[], text[], text[]) AS"
    " WITH head AS (SELECT coalesce(max(position), 0) AS head FROM events),"
    # Each event's version: its stream's, plus its rank in the stream's events of the query.
    " numbered AS (SELECT u.*, (SELECT coalesce(max(e.stream_version), 0) FROM events AS e"
    " WHERE e.stream_id = u.stream_id) + u.rank AS version"
    " FROM unnest($1, $2, $3, $4, $5, $6, $10, $11) WITH ORDINALITY"
    " AS u(event_id, stream_id, type, schema_version, expected, rank, data, meta, n))"
    " INSERT INTO events (position, event_id, stream_id, stream_version, type, schema_version,"
    " data, meta, recorded_at)"
    " SELECT head.head + n, event_id, stream_id, version, type, schema_version, data::json,"
    " meta::json, $7 FROM numbered, head"
    # An append refused: its first event is not numbered from its expected version.
    " WHERE NOT EXISTS (SELECT FROM numbered WHERE version - 1 <> expected)"
    # A projection to act on: another code's that follows, or this code's at the head.
    " AND NOT EXISTS (SELECT FROM projection_state AS p"
    " LEFT JOIN unnest($8, $9) AS ours(name, version)"
    " ON ours.name = p.name AND ours.version = p.version, head"
    f" WHERE CASE WHEN ours.name IS NULL THEN p.checkpoint = {FOLLOWING}"
    " ELSE p.checkpoint = head.head END)"
    " RETURNING position, stream_version",
)
"""The insert, prepared once per writer connection: it returns each inserted event's position
and version, and no row when it inserted nothing."""

_EXECUTE = (
    "SET LOCAL plan_cache_mode = force_generic_plan;"
    f" EXECUTE {APPEND_ROWS.name}(%(event_ids)s, %(stream_ids)s, %(types)s, %(schema_versions)s,"
    " %(expected)s, %(ranks)s, %(recorded_at)s, %(names)s, %(versions)s, %(datas)s, %(metas)s)"
)
"""Its generic plan, forced for the transaction: PostgreSQL otherwise planned the statement anew
at every run (600 custom plans in 600 runs, as `pg_prepared_statements` counts them: the generic
plan's estimate, for arrays of unknown length, looked worse), ~300 us an append, under the lock.
The generic plan reads the same indexes (the heads' and each stream's version)."""


def json_size(appends: Sequence[Sequence[PreparedAppend]]) -> int:
    """How many characters of JSON the appends carry (`SERVER_NUMBERED_MAX_CHARS` bounds it)."""
    return sum(
        len(text) for a in appends for item in a for text in (*item.data_jsons, *item.meta_jsons)
    )


def numbered_insert(
    appends: Sequence[Sequence[PreparedAppend]],
    recorded_at: datetime,
    ours: Mapping[str, int],
) -> tuple[str, dict[str, Any]]:
    """The insert's `EXECUTE` and its values (for `PostgresWriters.committed`): every event of
    `appends`, in order, with its rank among its stream's events in them (1, 2, ...), the first
    of each stream's part (`PreparedAppend`) carrying its expected version; `ours` the
    projections this code runs (name -> version)."""
    items = [item for a in appends for item in a]
    expected: list[int | None] = []
    ranks: list[int] = []
    counted: dict[str, int] = {}
    for item in items:
        expected += [item.expected_version, *[None] * (len(item.event_ids) - 1)]
        before = counted.get(item.stream_id, 0)
        counted[item.stream_id] = after = before + len(item.event_ids)
        ranks += range(before + 1, after + 1)
    values = {
        "event_ids": _text_array(e for item in items for e in item.event_ids),
        "stream_ids": _text_array(item.stream_id for item in items for _ in item.event_ids),
        "types": _text_array(t for item in items for t in item.types),
        "schema_versions": _int_array(v for item in items for v in item.schema_versions),
        "datas": _text_array(d for item in items for d in item.data_jsons),
        "metas": _text_array(m for item in items for m in item.meta_jsons),
        "expected": _int_array(expected),
        "ranks": _int_array(ranks),
        "recorded_at": recorded_at,
        "names": _text_array(ours),
        "versions": _int_array(ours.values()),
    }
    return _EXECUTE, values


def _text_array(values: Iterable[str]) -> str:
    """A `text[]` literal: each element double-quoted, its backslashes and quotes escaped."""
    quoted = ['"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values]
    return "{" + ",".join(quoted) + "}"


def _int_array(values: Iterable[int | None]) -> str:
    return "{" + ",".join("NULL" if v is None else str(v) for v in values) + "}"
