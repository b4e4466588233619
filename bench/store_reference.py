"""The workload and the raw sqlite3 reference of store_bench: the store's SQL, sent by hand.

Kept apart from the timing and the report (store_bench.py) so each file has one job.
"""

from __future__ import annotations

import gc
import json
import os
import re
import socket
import sqlite3
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from sqlalchemy import MetaData, Table
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.schema import CreateIndex, CreateTable

from trm_store import RecordedEvent, domain, register_event_type
from trm_store.append_heads import NO_EPOCH
from trm_store.backend import Durability
from trm_store.event_types import event_type
from trm_store.projections import registered_projections
from trm_store.rows_insert import row_chunks

# -- the workload -------------------------------------------------------------------------------


class Appended(BaseModel):
    """The payload of the append sections, shaped like a prediction."""

    question_id: str
    unit_id: str
    prediction: str | None
    correct: bool
    stop_reason: str
    latency_ms: float
    tokens: int


APPENDED = "bench.appended"
"""No projection subscribes to it: an append's inline work is the projection_state UPDATE."""
REGISTERED, PREDICTION, COMPLETED = "run.registered", "run.prediction_recorded", "run.completed"
PER_RUN = 500
BATCH = 1000
"""Store.read_all's and the projection runner's default batch size."""


def appended(i: int) -> dict[str, Any]:
    """The payload of append number `i` (validation leaves it as it is)."""
    return {
        "question_id": f"q{i % 5000:06d}",
        "unit_id": f"u{i % 700:05d}",
        "prediction": "ABCD"[i % 4] if i % 50 else None,
        "correct": i % 3 != 0,
        "stop_reason": "stop" if i % 40 else "length",
        "latency_ms": 250.0 + (i * 7919) % 4000 / 4,
        "tokens": 100 + (i * 104729) % 900,
    }


def prediction(i: int, k: int) -> dict[str, Any]:
    """The data of question `k` of a run, as `RunLog.record_prediction` records it."""
    answered = (i + k) % 50 != 0
    return {
        "question_id": f"q{k:05d}",
        "unit_id": f"u{k // 5:04d}",
        "prediction": "ABCD"[(i + k) % 4] if answered else None,
        "correct": (i + k) % 3 != 0 if answered else None,
        "stop_reason": "stop" if answered else "parse_error",  # INFRA: no verdict
        "fields": {"latency_ms": 250.0 + (i + k) % 4000 / 4, "tokens": 100 + (i + k) % 900},
    }


def run_log(n: int) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(stream, type, data) of `n` events as `RunLog` writes them: runs of 500 predictions,
    each registered first and completed last; data in the store's validated normal form
    (every 50th prediction is validated, to check that its normal form is itself)."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    i = run = 0
    while i < n:
        at = start + timedelta(minutes=run)
        config = {"model": "m", "seed": run, "pool": "val"}
        body = [(REGISTERED, {"started_at": at, "config": config, "host": "h", "pid": 1})]
        body += [(PREDICTION, prediction(i, k)) for k in range(PER_RUN)]
        body.append((COMPLETED, {"finished_at": at + timedelta(seconds=30)}))
        for j, (type_, data) in enumerate(body[: n - i]):
            if type_ != PREDICTION or j % 50 == 1:
                normal = event_type(type_).validate(data)
                if type_ == PREDICTION and normal != data:
                    raise SystemExit(f"{PREDICTION} normalises {data} to {normal}: fix the bench")
                data = normal
            yield f"run:bench-{run:05d}", type_, data
        i += len(body)
        run += 1


def register_workload() -> None:
    """trm's domain types and projections, plus the bench's append type (idempotent)."""
    domain.load()
    register_event_type(APPENDED, Appended)


# -- the raw sqlite3 reference: the store's SQL, by hand ----------------------------------------

SQL_AFTER = (
    "SELECT position, event_id, stream_id, stream_version, type, schema_version, data, meta, "
    "recorded_at FROM events WHERE position > ? ORDER BY position LIMIT ?"
)
"""The log read of `read_all` and of a rebuild (`trm_store.log.events_after`)."""
SQL_LAST = "SELECT coalesce(max(position), 0) FROM events"
SQL_WRITE = (
    "INSERT INTO events (position, event_id, stream_id, stream_version, type, schema_version, "
    "data, meta, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
"""Writes the big log (not timed)."""
PRAGMAS = ("journal_mode=WAL", "busy_timeout=60000")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}")
IN_LIST = re.compile(r"IN \(\?(?:, \?)*\)")
INSERT_COLUMNS = re.compile(r"INSERT (?:OR ROLLBACK )?INTO events \(([^)]*)\) VALUES")


def sql_time(at: datetime) -> str:
    """A datetime as SQLAlchemy's SQLite DATETIME stores it."""
    return f"{at:%Y-%m-%d %H:%M:%S.%f}"


def connect(path: Path, durability: Durability = "normal") -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=60)
    for pragma in (*PRAGMAS, f"synchronous={'FULL' if durability == 'full' else 'NORMAL'}"):
        conn.execute(f"PRAGMA {pragma}")
    return conn


def to_event(row: Sequence[Any], current: Mapping[str, int]) -> RecordedEvent:
    """A row as a RecordedEvent, with the store's upcast check and datetime parse."""
    position, event_id, stream_id, version, type_, schema_version, data, meta, at = row
    if current.get(type_, schema_version) != schema_version:
        raise AssertionError("the bench writes current schema versions only")
    return RecordedEvent(
        position,
        event_id,
        stream_id,
        version,
        type_,
        schema_version,
        json.loads(data),
        json.loads(meta),
        datetime.fromisoformat(at).replace(tzinfo=UTC),
    )


def schema_versions() -> dict[str, int]:
    """The current schema version of every type the bench writes (all at 1: nothing to upcast)."""
    return {name: 1 for name in (APPENDED, REGISTERED, PREDICTION, COMPLETED)}


def dumps(value: Any, canonical: bool) -> str:
    """JSON text as the store writes it: canonical (sorted keys, no spaces) or json.dumps'."""
    if canonical:
        return json.dumps(value, allow_nan=False, sort_keys=True, separators=(",", ":"))
    return json.dumps(value)


class Var(Enum):
    """A value the reference computes itself where the store sent one of its own."""

    STREAM = "stream id"
    PREVIOUS = "head before the append"
    NEW = "head after the append"
    NOW = "timestamp"
    EPOCH = "projections' epoch known"


@dataclass(frozen=True)
class Statement:
    sql: str
    params: tuple[Any, ...]
    """Constants as the store sent them, and Var where the reference puts its own value."""

    def bind(self, values: Mapping[Var, Any]) -> tuple[Any, ...]:
        return tuple(values[p] if isinstance(p, Var) else p for p in self.params)


@dataclass(frozen=True)
class Plan:
    """The store's append as `learn` saw it: each step's SQL text, the values it sends, and how
    it writes JSON. The reference replays it with values it computes by hand."""

    head: Statement | None
    """The log head alone, when the store reads it apart from the first stream's version."""
    heads: Statement | None
    """The log head and the first stream's version in one statement, when the store does that."""
    stream_head: Statement
    """The versions of the streams after the first (`trm_store.log.stream_heads`), learned
    for one stream: the reference widens its IN list."""
    insert: str
    """The INSERT of one event row."""
    columns: tuple[str, ...]
    multi_row: bool
    """True when the store sends many rows in one statement (`trm_store.rows_insert.RowsInsert`:
    statements of a power of two of rows, at most 64); False: one `executemany`."""
    advance: Statement | None
    by_id: str | None
    """The lookup of the appended event ids, if the store makes it on every append."""
    canonical: bool


class RawLog:
    """sqlite3 by hand, sending per append exactly the statements `Store.append_batch` sends."""

    def __init__(self, path: Path, durability: Durability, plan: Plan) -> None:
        self.conn = connect(path, durability)
        self.plan = plan
        self.origin = {"host": socket.gethostname(), "pid": os.getpid()}
        self.sent: list[str] | None = None
        self.epoch = NO_EPOCH
        """The projections' epoch as the last heads' read found it: sent with the next one,
        which then returns no projection's row (as the store's, in a steady run)."""

    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        if self.sent is not None:
            self.sent.append(sql)
        return self.conn.execute(sql, params).fetchall()

    def _step(self, step: Statement, values: Mapping[Var, Any]) -> list[Any]:
        return self._run(step.sql, step.bind(values))

    def append(self, items: Sequence[tuple[str, Sequence[dict[str, Any]]]]) -> list[RecordedEvent]:
        prepared = [
            (stream, [(str(uuid.uuid4()), data, {**self.origin}) for data in datas])
            for stream, datas in items
        ]
        ids = sorted(eid for _, evs in prepared for eid, *_ in evs)
        now = datetime.now(UTC)
        at = sql_time(now)
        plan = self.plan
        self._run("BEGIN IMMEDIATE")
        if plan.by_id and self._run(
            IN_LIST.sub(f"IN ({', '.join('?' * len(ids))})", plan.by_id), ids
        ):
            raise AssertionError("fresh uuid4 ids are never recorded")
        versions: dict[str, int] = {}
        if plan.heads is not None:
            first = prepared[0][0]
            # The heads, with a projection's row each when the epoch sent is not the one the
            # database holds (`trm_store.append_heads`), all fetched as the store fetches them;
            # deciding who follows is the store's own work, which the reference skips (none
            # changes in a steady run).
            heads = self._step(plan.heads, {Var.STREAM: first, Var.EPOCH: self.epoch})
            previous, versions[first], self.epoch = heads[0][0], heads[0][1], heads[0][2]
        else:
            assert plan.head is not None
            previous = self._step(plan.head, {})[0][0]
        others = list(dict.fromkeys(s for s, _ in prepared if s not in versions))
        if others:  # the other streams' versions in one query, its IN list padded as the store's
            size = 1 << (len(others) - 1).bit_length()
            sql = IN_LIST.sub(f"IN ({', '.join('?' * size)})", plan.stream_head.sql)
            found = dict(self._run(sql, [*others, *[others[-1]] * (size - len(others))]))
            versions.update({s: found.get(s, 0) for s in others})
        position = previous
        rows: list[Any] = []
        recorded = []
        named = ":position" in plan.insert
        for stream, evs in prepared:
            for eid, data, meta in evs:
                position += 1
                versions[stream] += 1
                v = versions[stream]
                text, meta_text = dumps(data, plan.canonical), dumps(meta, plan.canonical)
                row = {
                    "position": position,
                    "event_id": eid,
                    "stream_id": stream,
                    "stream_version": v,
                    "type": APPENDED,
                    "schema_version": 1,
                    "data": text,
                    "meta": meta_text,
                    "recorded_at": at,
                }
                rows.append(row if named else tuple(row[c] for c in plan.columns))
                recorded.append(
                    RecordedEvent(position, eid, stream, v, APPENDED, 1, data, meta, now)
                )
        if plan.multi_row:  # the store's statements, each of as many rows as the store's
            start, values = 0, plan.insert[plan.insert.index(" VALUES ") + 8 :]
            for size in row_chunks(len(rows)):
                chunk = [v for row in rows[start : start + size] for v in row]
                self._run(plan.insert + f", {values}" * (size - 1), chunk)
                start += size
        else:
            if self.sent is not None:
                self.sent.append(plan.insert)
            self.conn.executemany(plan.insert, rows)
        if plan.advance is not None:
            moved = {
                Var.PREVIOUS: previous,
                Var.NEW: position,
                Var.NOW: sql_time(datetime.now(UTC)),
            }
            self._step(plan.advance, moved)
        self._run("COMMIT")
        return recorded


def raw_read_all(conn: sqlite3.Connection, after: int) -> Iterator[RecordedEvent]:
    """The reference `read_all`: one read transaction per batch, rows turned into events."""
    current = schema_versions()
    while True:
        conn.execute("BEGIN")
        rows = conn.execute(SQL_AFTER, (after, BATCH)).fetchall()
        conn.execute("COMMIT")
        batch = [to_event(r, current) for r in rows]
        yield from batch
        if len(batch) < BATCH:
            return
        after = batch[-1].position


class RawRuns:
    """The `runs` projection's work (trm_store/domain/runs.py), by hand, for the rebuild."""

    def __init__(self, suffix: str, canonical: bool) -> None:
        self.canonical = canonical
        self.tables = registered_projections()["runs"].define(MetaData(), suffix)
        r, p = self.tables["runs"].name, self.tables["predictions"].name
        keep = ("unit_id", "prediction", "correct", "stop_reason", "fields")
        self.upsert = (
            f"INSERT INTO {p} (run_id, question_id, seq, unit_id, prediction, correct, "
            f"stop_reason, fields) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, "
            f"question_id) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in keep)}"
        )
        self.version = f"UPDATE {r} SET version = ? WHERE run_id = ?"
        again = ("status", "finished_at", "config", "host", "pid", "reason", "error")
        self.register = (  # one upsert: a resumed run keeps its started_at and its count
            f"INSERT INTO {r} (run_id, status, started_at, finished_at, config, host, pid, reason,"
            " error, last_event_at, version, predictions) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
            f" ?) ON CONFLICT (run_id) DO UPDATE SET"
            f" {', '.join(f'{c} = excluded.{c}' for c in again)}, "
            "last_event_at = excluded.last_event_at, version = excluded.version"
        )
        self.counted = f"SELECT count(*) FROM {p} WHERE run_id = ?"
        self.seen = f"SELECT count(*) FROM {p} WHERE run_id = ? AND question_id IN "
        self.count_new = f"UPDATE {r} SET predictions = predictions + ? WHERE run_id = ?"
        self.complete = (
            f"UPDATE {r} SET status = ?, finished_at = ?, last_event_at = ?, version = ? "
            "WHERE run_id = ?"
        )

    def ddl(self) -> list[str]:
        dialect = sqlite_dialect.dialect()
        out = []
        for table in self.tables.values():
            out.append(str(CreateTable(table).compile(dialect=dialect)))
            out += self.indexes(table)
        return out

    @staticmethod
    def indexes(table: Table) -> list[str]:
        dialect = sqlite_dialect.dialect()
        return [str(CreateIndex(i).compile(dialect=dialect)) for i in table.indexes]

    def apply(self, conn: sqlite3.Connection, events: Sequence[RecordedEvent]) -> None:
        rows: dict[tuple[str, str], tuple[Any, ...]] = {}
        versions: dict[str, int] = {}
        for e in events:
            run_id, d = e.stream_id.removeprefix("run:"), e.data
            versions[run_id] = e.version
            if e.type == PREDICTION:
                rows[(run_id, d["question_id"])] = (
                    run_id,
                    d["question_id"],
                    e.version,
                    d["unit_id"],
                    # JsonColumn stores None as SQL NULL, not the JSON text 'null'
                    None if d["prediction"] is None else dumps(d["prediction"], self.canonical),
                    d["correct"],
                    d["stop_reason"],
                    dumps(d["fields"], self.canonical),
                )
            elif e.type == REGISTERED:
                started = sql_time(datetime.fromisoformat(d["started_at"]))
                config = dumps(d["config"], self.canonical)
                at = sql_time(e.recorded_at)
                host, pid = d["host"], d["pid"]
                row = (run_id, "running", started, None, config, host, pid, None, None, at)
                (earlier,) = conn.execute(self.counted, (run_id,)).fetchone()
                conn.execute(self.register, (*row, e.version, earlier))
            elif e.type == COMPLETED:
                finished = sql_time(datetime.fromisoformat(d["finished_at"]))
                at = sql_time(e.recorded_at)
                conn.execute(self.complete, ("completed", finished, at, e.version, run_id))
            else:
                raise AssertionError(f"the bench log has no {e.type} events")
        self._count_new(conn, list(rows))
        if rows:
            conn.executemany(self.upsert, list(rows.values()))
        conn.executemany(self.version, [(v, r) for r, v in versions.items()])

    def _count_new(self, conn: sqlite3.Connection, keys: Sequence[tuple[str, str]]) -> None:
        """Each run's count grows by the questions of the batch it had not predicted yet: the
        same primary-key reads, 500 ids a query, and update as the projection's."""
        asked: dict[str, list[str]] = {}
        for run_id, question_id in keys:
            asked.setdefault(run_id, []).append(question_id)
        for run_id, questions in asked.items():
            seen = 0
            for i in range(0, len(questions), 500):
                chunk = questions[i : i + 500]
                marks = f"({', '.join('?' * len(chunk))})"
                seen += conn.execute(self.seen + marks, (run_id, *chunk)).fetchone()[0]
            if len(questions) > seen:
                conn.execute(self.count_new, (len(questions) - seen, run_id))


def raw_rebuild(path: Path, canonical: bool) -> int:
    """The store's rebuild of `runs` (scratch tables, a commit per batch, one swap), by hand:
    the cyclic GC paused during the fill and the scratch tables renamed in, as the store does."""
    conn = connect(path)
    scratch, live = RawRuns("__rebuild", canonical), RawRuns("", canonical)
    current = schema_versions()

    now = sql_time(datetime.now(UTC))
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "UPDATE projection_state SET status='rebuilding', updated_at=? WHERE name=?", (now, "runs")
    )
    conn.execute("COMMIT")
    conn.execute("BEGIN IMMEDIATE")
    for sql in [f"DROP TABLE IF EXISTS {t.name}" for t in scratch.tables.values()] + scratch.ddl():
        conn.execute(sql)
    conn.execute("COMMIT")
    after = applied = 0
    gc.disable()
    try:
        while True:
            conn.execute("BEGIN IMMEDIATE")
            batch = [to_event(r, current) for r in conn.execute(SQL_AFTER, (after, BATCH))]
            mine = [e for e in batch if e.type in (REGISTERED, PREDICTION, COMPLETED)]
            if mine:
                scratch.apply(conn, mine)
            conn.execute("COMMIT")
            applied += len(mine)
            if len(batch) < BATCH:
                break
            after = batch[-1].position
    finally:
        gc.enable()
    conn.execute("BEGIN IMMEDIATE")
    head = conn.execute(SQL_LAST).fetchone()[0]
    for logical, table in live.tables.items():
        source = scratch.tables[logical]
        for index in source.indexes:
            conn.execute(f"DROP INDEX {index.name}")
        conn.execute(f"DROP TABLE IF EXISTS {table.name}")
        conn.execute(f"ALTER TABLE {source.name} RENAME TO {table.name}")
        for sql in live.indexes(table):
            conn.execute(sql)
    conn.execute("DELETE FROM projection_state WHERE name=?", ("runs",))
    conn.execute("INSERT INTO projection_state VALUES ('runs', 1, ?, 'ready', ?)", (head, now))
    conn.execute("COMMIT")
    conn.close()
    return applied
