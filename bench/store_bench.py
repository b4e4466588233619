"""store_bench: trm's SQLite event store against raw sqlite3 doing the same work in the same run.

The reference is honest: its database is created by `open_store` (same migrations, triggers,
indexes, trm's domain projections and their bookkeeping), its connection uses the same pragmas,
and per append it sends the very SQL the store sends, in the same order: the SQL text and its
constants are learnt from a captured store append (`learn`), the values are computed by hand,
and one append of each shape is compared statement by statement and row by row before anything
is timed (`check`). It skips only what trm adds on top of SQL: validation, SQLAlchemy and the
projection runner. The rebuild reference re-implements the `runs` projection by hand and must
produce identical tables (compared by hash after the run).

    .venv/bin/python bench/store_bench.py             # full size: 1,000,000-event log
    .venv/bin/python bench/store_bench.py --quick     # every section at a small size

Exit code 0 whatever the figures: it is a report, not a test.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import re
import resource
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.table import Table as RichTable
from sqlalchemy import Engine, MetaData, event
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.schema import CreateIndex, CreateTable

import trm_store
from trm_store import NewEvent, RecordedEvent, Store, domain, open_store, register_event_type
from trm_store.backend import Durability
from trm_store.events import event_type
from trm_store.projections import registered_projections

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
        "stop_reason": "stop" if answered else "length",
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

_COLS = (
    "events.position, events.event_id, events.stream_id, events.stream_version, events.type, "
    "events.schema_version, events.data, events.meta, events.recorded_at"
)
SQL_AFTER = (
    f"SELECT {_COLS} \nFROM events \nWHERE events.position > ? ORDER BY events.position\n"
    " LIMIT ? OFFSET ?"
)
"""The log read of `read_all` and of a rebuild (SQLAlchemy's rendering of `events_after`)."""
SQL_LAST = "SELECT coalesce(max(position), 0) FROM events"
SQL_WRITE = (
    "INSERT INTO events (position, event_id, stream_id, stream_version, type, schema_version, "
    "data, meta, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
"""Writes the big log (not timed)."""
PRAGMAS = ("journal_mode=WAL", "busy_timeout=60000")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}")
IN_LIST = re.compile(r"IN \(\?(?:, \?)*\)")
INSERT_COLUMNS = re.compile(r"INSERT INTO events \(([^)]*)\) VALUES")


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
    insert: str
    columns: tuple[str, ...]
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
            previous, versions[first] = self._step(plan.heads, {Var.STREAM: first})[0]
        else:
            assert plan.head is not None
            previous = self._step(plan.head, {})[0][0]
        position = previous
        rows: list[Any] = []
        recorded = []
        named = ":position" in plan.insert
        for stream, evs in prepared:
            if stream not in versions:
                versions[stream] = self._step(plan.stream_head, {Var.STREAM: stream})[0][0]
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
        self.conn.execute("COMMIT")
        return recorded


def raw_read_all(conn: sqlite3.Connection, after: int) -> Iterator[RecordedEvent]:
    """The reference `read_all`: one read transaction per batch, rows turned into events."""
    current = schema_versions()
    while True:
        conn.execute("BEGIN")
        rows = conn.execute(SQL_AFTER, (after, BATCH, 0)).fetchall()
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
        self.version = f"UPDATE {r} SET version=? WHERE {r}.run_id = ?"
        self.register = (
            f"UPDATE {r} SET status='running', finished_at=NULL, config=?, host=?, pid=?, "
            f"reason=NULL, error=NULL, version=?, last_event_at=? WHERE {r}.run_id = ?"
        )
        self.insert = (
            f"INSERT INTO {r} (run_id, status, started_at, finished_at, config, host, pid, reason,"
            f" error, version, last_event_at) VALUES (?, 'running', ?, NULL, ?, ?, ?, NULL, NULL,"
            " ?, ?)"
        )
        self.complete = (
            f"UPDATE {r} SET status='completed', finished_at=?, version=?, last_event_at=? "
            f"WHERE {r}.run_id = ?"
        )

    def ddl(self) -> list[str]:
        dialect = sqlite_dialect.dialect()
        out = []
        for table in self.tables.values():
            out.append(str(CreateTable(table).compile(dialect=dialect)))
            out += [str(CreateIndex(i).compile(dialect=dialect)) for i in table.indexes]
        return out

    def apply(self, conn: sqlite3.Connection, events: Sequence[RecordedEvent]) -> None:
        rows: dict[tuple[str, str], tuple[Any, ...]] = {}
        versions: dict[str, int] = {}
        for e in events:
            run_id, d = e.stream_id.removeprefix("run:"), e.data
            versions[run_id] = e.version
            at = sql_time(e.recorded_at)
            if e.type == PREDICTION:
                rows[(run_id, d["question_id"])] = (
                    run_id,
                    d["question_id"],
                    e.version,
                    d["unit_id"],
                    dumps(d["prediction"], self.canonical),
                    d["correct"],
                    d["stop_reason"],
                    dumps(d["fields"], self.canonical),
                )
            elif e.type == REGISTERED:
                config = dumps(d["config"], self.canonical)
                values = (config, d["host"], d["pid"], e.version, at, run_id)
                if conn.execute(self.register, values).rowcount == 0:
                    started = sql_time(datetime.fromisoformat(d["started_at"]))
                    conn.execute(
                        self.insert, (run_id, started, config, d["host"], d["pid"], e.version, at)
                    )
            elif e.type == COMPLETED:
                finished = sql_time(datetime.fromisoformat(d["finished_at"]))
                conn.execute(self.complete, (finished, e.version, at, run_id))
            else:
                raise AssertionError(f"the bench log has no {e.type} events")
        if rows:
            conn.executemany(self.upsert, list(rows.values()))
        conn.executemany(self.version, [(v, r) for r, v in versions.items()])


def raw_rebuild(path: Path, canonical: bool) -> int:
    """The store's rebuild of `runs` (scratch tables, a commit per batch, one swap), by hand."""
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
    while True:
        conn.execute("BEGIN IMMEDIATE")
        batch = [to_event(r, current) for r in conn.execute(SQL_AFTER, (after, BATCH, 0))]
        mine = [e for e in batch if e.type in (REGISTERED, PREDICTION, COMPLETED)]
        if mine:
            scratch.apply(conn, mine)
        conn.execute("COMMIT")
        applied += len(mine)
        if len(batch) < BATCH:
            break
        after = batch[-1].position
    conn.execute("BEGIN IMMEDIATE")
    head = conn.execute(SQL_LAST).fetchone()[0]
    for table in live.tables.values():
        conn.execute(f"DROP TABLE IF EXISTS {table.name}")
    for sql in live.ddl():
        conn.execute(sql)
    for logical, table in live.tables.items():
        columns = ", ".join(c.name for c in table.c)
        source = scratch.tables[logical].name
        conn.execute(f"INSERT INTO {table.name} ({columns}) SELECT {columns} FROM {source}")
        conn.execute(f"DROP TABLE {source}")
    conn.execute("DELETE FROM projection_state WHERE name=?", ("runs",))
    conn.execute("INSERT INTO projection_state VALUES ('runs', 1, ?, 'ready', ?)", (head, now))
    conn.execute("COMMIT")
    conn.close()
    return applied


# -- timing -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rates:
    """Median units/s over alternating rounds, by wall clock and by CPU time."""

    trm: float
    raw: float
    trm_cpu: float
    raw_cpu: float


def alternate(trm: Callable[[int], int], raw: Callable[[int], int], rounds: int) -> Rates:
    """Run round k of trm then of raw, for every k; medians resist the noise of a shared box."""
    wall: tuple[list[float], list[float]] = ([], [])
    cpu: tuple[list[float], list[float]] = ([], [])
    for k in range(rounds):
        for side, fn in enumerate((trm, raw)):
            start, start_cpu = time.perf_counter(), time.process_time()
            units = fn(k)
            wall[side].append(units / (time.perf_counter() - start))
            cpu[side].append(units / max(time.process_time() - start_cpu, 1e-9))
    med = statistics.median
    return Rates(med(wall[0]), med(wall[1]), med(cpu[0]), med(cpu[1]))


def fresh(path: Path, durability: Durability = "normal") -> Store:
    """A new store at `path` with every registered projection (as `open_store` has it)."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return open_store(f"sqlite:///{path}", durability=durability)


@dataclass(frozen=True)
class Shape:
    """Per transaction: `streams` streams of `per_stream` events each."""

    streams: int
    per_stream: int

    def items(self, tick: int) -> list[tuple[str, list[dict[str, Any]]]]:
        datas = [appended(tick * self.per_stream + k) for k in range(self.per_stream)]
        return [(f"bench:{(tick + s) % 97}", datas) for s in range(self.streams)]

    def trm(self, store: Store, tick: int) -> list[RecordedEvent]:
        """`append` for one stream, `append_batch` for several: the calls a writer makes."""
        items = [(s, [NewEvent(APPENDED, d) for d in ds]) for s, ds in self.items(tick)]
        if len(items) == 1:
            return store.append(*items[0])
        return store.append_batch([(s, evs, None) for s, evs in items])


def bench_appends(
    workdir: Path,
    durability: Durability,
    shape: Shape,
    sizes: tuple[int, int],
    plan: Plan,
) -> Rates:
    """Events/s with one append (of `shape`) per transaction: trm vs the reference."""
    per_round, rounds = sizes
    store = fresh(workdir / "trm.db", durability)
    fresh(workdir / "raw.db", durability).close()
    raw = RawLog(workdir / "raw.db", durability, plan)
    ticks = itertools.count()
    events = per_round * shape.streams * shape.per_stream

    def trm_round(_k: int) -> int:
        for _ in range(per_round):
            shape.trm(store, next(ticks))
        return events

    def raw_round(_k: int) -> int:
        for _ in range(per_round):
            raw.append(shape.items(next(ticks)))
        return events

    try:
        return alternate(trm_round, raw_round, rounds)
    finally:
        store.close()
        raw.conn.close()


LAST_ROW = "SELECT data, meta, length(recorded_at) FROM events ORDER BY position DESC LIMIT 1"


@contextmanager
def capturing() -> Iterator[list[tuple[str, Any]]]:
    """The (SQL, parameters) SQLAlchemy sends to the driver while the block runs."""
    sent: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_rest: Any) -> None:
        sent.append((statement, parameters))

    event.listen(Engine, "before_cursor_execute", capture)
    try:
        yield sent
    finally:
        event.remove(Engine, "before_cursor_execute", capture)


def learn(workdir: Path) -> Plan:
    """Capture one append by the store: its SQL is what the reference will send.

    A 1000-event append first makes the head (1000, 1001) distinct from the constants the
    store sends (0s, projection versions), so each value sent is recognised for what it is.
    """
    store = fresh(workdir / "trm.db")
    try:
        store.append("bench:warm-up", [NewEvent(APPENDED, appended(k)) for k in range(1000)])
        with capturing() as sent:  # two streams: the store may read the second one apart
            e, last = store.append_batch(
                [
                    ("bench:probe", [NewEvent(APPENDED, appended(0))], None),
                    ("bench:probe2", [NewEvent(APPENDED, appended(1))], None),
                ]
            )
        with store.write_transaction() as conn:
            stored = conn.exec_driver_sql(LAST_ROW).first()
    finally:
        store.close()
    known = {
        "bench:probe": Var.STREAM,
        "bench:probe2": Var.STREAM,
        e.position - 1: Var.PREVIOUS,
        last.position: Var.NEW,
    }

    def step(sql: str, params: Sequence[Any]) -> Statement:
        now = [isinstance(p, str) and TIMESTAMP.fullmatch(p) is not None for p in params]
        return Statement(
            sql, tuple(Var.NOW if t else known.get(p, p) for p, t in zip(params, now, strict=True))
        )

    steps: dict[str, Any] = {}
    for sql, params in sent:
        if sql == "BEGIN IMMEDIATE":
            continue
        if columns := INSERT_COLUMNS.match(sql):
            steps["insert"], steps["columns"] = sql, tuple(c.strip() for c in columns[1].split(","))
        elif e.event_id in params:
            steps["by_id"] = sql
        elif "projection_state" in sql:
            steps["advance"] = step(sql, params)
        elif Var.STREAM in step(sql, params).params and "max(position)" in sql:
            steps["heads"] = step(sql, params)
        elif Var.STREAM in step(sql, params).params:
            steps["stream_head"] = step(sql, params)
        elif "head" not in steps:
            steps["head"] = step(sql, params)
        else:
            raise SystemExit(f"the bench does not know this step of the store's append: {sql!r}")
    has_head = "head" in steps or "heads" in steps
    if stored is None or not has_head or not {"stream_head", "insert"} <= steps.keys():
        raise SystemExit(f"the bench cannot follow the store's append: {[s for s, _ in sent]}")
    canonical = dumps(json.loads(stored[0]), True) == stored[0]
    optional = {name: steps.pop(name, None) for name in ("advance", "by_id", "head", "heads")}
    return Plan(**steps, **optional, canonical=canonical)


def check(workdir: Path, shape: Shape, plan: Plan) -> list[str]:
    """Differences between one append of `shape` by the store and by the reference: the SQL
    sent, statement by statement, and the row stored (empty: none)."""
    store = fresh(workdir / "trm.db")
    fresh(workdir / "raw.db").close()
    try:
        shape.trm(store, 0)  # warm-up: the first append also opens the pool's connection
        with capturing() as sent:
            shape.trm(store, 1)
        with store.write_transaction() as conn:
            trm_row = conn.exec_driver_sql(LAST_ROW).one()
    finally:
        store.close()
    raw = RawLog(workdir / "raw.db", "normal", plan)
    raw.sent = []
    raw.append(shape.items(1))
    raw_row = raw.conn.execute(LAST_ROW).fetchone()
    raw.conn.close()
    texts = [sql for sql, _ in sent]
    diffs = [f"store: {a!r}\n  raw: {b!r}" for a, b in zip(texts, raw.sent, strict=False) if a != b]
    if len(texts) != len(raw.sent):
        diffs.append(f"the store sent {len(texts)} statements, the reference {len(raw.sent)}")
    if tuple(trm_row) != raw_row:
        diffs.append(f"stored rows differ: {tuple(trm_row)!r} vs {raw_row!r}")
    return diffs


# -- a big log: read_all and rebuild ------------------------------------------------------------


def build_log(path: Path, n: int, canonical: bool) -> None:
    """A store holding `n` run events, rows written with sqlite3 the way the store writes them
    (fast; not measured). The first rebuild (the reference's) then builds the projection."""
    fresh(path).close()
    conn = connect(path)
    meta = dumps({"host": socket.gethostname(), "pid": os.getpid()}, canonical)
    versions: dict[str, int] = {}
    rows = []
    conn.execute("BEGIN IMMEDIATE")
    for position, (stream, type_, data) in enumerate(run_log(n), start=1):
        versions[stream] = versions.get(stream, 0) + 1
        at = sql_time(datetime.now(UTC))
        data_text = dumps(data, canonical)
        row = (position, str(uuid.uuid4()), stream, versions[stream], type_, 1, data_text)
        rows.append((*row, meta, at))
        if len(rows) == 10_000:
            conn.executemany(SQL_WRITE, rows)
            rows.clear()
    conn.executemany(SQL_WRITE, rows)
    conn.execute("COMMIT")
    conn.close()


def bench_read_all(path: Path, n: int, rounds: int) -> Rates:
    """Events/s of `read_all` (batch 1000) over slices of the log, trm and raw alternating."""
    store = open_store(f"sqlite:///{path}", read_only=True)  # no catch-up: nothing to time
    conn = connect(path)
    size = max(BATCH, n // rounds // BATCH * BATCH)

    def trm(k: int) -> int:
        return sum(1 for _ in itertools.islice(store.read_all(k * size, BATCH), size))

    def raw(k: int) -> int:
        return sum(1 for _ in itertools.islice(raw_read_all(conn, k * size), size))

    try:
        return alternate(trm, raw, max(1, min(rounds, n // size)))
    finally:
        store.close()
        conn.close()


def digest(path: Path) -> str:
    """A hash of the `runs` projection's live tables, to check the reference built the same."""
    conn = sqlite3.connect(path)
    h = hashlib.sha256()
    for query in ("SELECT * FROM runs ORDER BY run_id", "SELECT * FROM predictions ORDER BY 1, 2"):
        for row in conn.execute(query):
            h.update(repr(row).encode())
    conn.close()
    return h.hexdigest()


def rebuild_child(side: str, path: Path, canonical: bool) -> None:
    """Child process: one rebuild, then events, seconds, CPU and peak RSS as JSON on stdout."""
    register_workload()
    store = open_store(f"sqlite:///{path}") if side == "trm" else None
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    if store is not None:
        applied = store.rebuild_projections()["runs"]
        store.close()
    else:
        applied = raw_rebuild(path, canonical)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    result = {"events": applied, "seconds": seconds, "cpu": cpu, "rss_before_kb": before.ru_maxrss}
    print(json.dumps({**result, "peak_kb": after.ru_maxrss, "digest": digest(path)}))


def run_child(side: str, path: Path, canonical: bool) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--rebuild-child", side, str(path), str(int(canonical))],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- the report ---------------------------------------------------------------------------------


def floor2(ratio: float) -> str:
    """Two decimals, rounded down: 0.598 shows as 0.59, as a miss of 0.6 should."""
    return f"{math.floor(ratio * 100) / 100:.2f}"


@dataclass(frozen=True)
class Figure:
    name: str
    unit: str
    trm: float
    raw: float
    ratio_cpu: float | None
    target: str
    passed: bool

    def row(self) -> list[str]:
        cpu = "-" if self.ratio_cpu is None else f"{floor2(self.ratio_cpu)}x"
        verdict = "[green]pass" if self.passed else "[bold red]MISSED"
        return [
            self.name,
            f"{self.trm:,.0f} {self.unit}",
            f"{self.raw:,.0f} {self.unit}",
            f"{floor2(self.trm / self.raw)}x",
            cpu,
            self.target,
            verdict,
        ]


def versus(name: str, rates: Rates, at_least: float) -> Figure:
    passed = rates.trm >= at_least * rates.raw
    cpu = rates.trm_cpu / rates.raw_cpu
    return Figure(name, "ev/s", rates.trm, rates.raw, cpu, f">= {at_least}x raw", passed)


@dataclass(frozen=True)
class Sizes:
    rounds: int
    singles: int
    fsyncs: int
    batches: int
    events: int


def sizes(quick: bool, events: int) -> Sizes:
    if quick:
        return Sizes(rounds=3, singles=60, fsyncs=10, batches=4, events=min(events, 10_000))
    return Sizes(rounds=7, singles=1000, fsyncs=150, batches=50, events=events)


def measure_appends(
    workdir: Path, size: Sizes, say: Callable[[str], None]
) -> tuple[list[Figure], Plan]:
    one, hundred, spread = Shape(1, 1), Shape(1, 100), Shape(10, 10)
    plan = learn(workdir)
    if diffs := check(workdir, one, plan) + check(workdir, spread, plan):
        raise SystemExit("the reference does not do what the store does:\n" + "\n".join(diffs))
    lookup = "with" if plan.by_id else "without"
    say(f"the reference sends the store's SQL ({lookup} an id lookup) and stores the same rows")
    durabilities: tuple[tuple[Durability, int, float], ...] = (
        ("normal", size.singles, 0.5),
        ("full", size.fsyncs, 0.9),
    )
    figures = []
    for durability, n, target in durabilities:
        rates = bench_appends(workdir, durability, one, (n, size.rounds), plan)
        figures.append(versus(f"append 1 event/txn, {durability}", rates, target))
        say(figures[-1].name)
    for label, shape in (("append 100 events, 1 stream", hundred), ("append_batch 10x10", spread)):
        rates = bench_appends(workdir, "normal", shape, (size.batches, size.rounds), plan)
        figures.append(versus(label, rates, 0.6))
        say(label)
    return figures, plan


def measure_log(
    workdir: Path, size: Sizes, canonical: bool, say: Callable[[str], None]
) -> list[Figure]:
    n, log = size.events, workdir / "log.db"
    build_log(log, n, canonical)
    say(f"log of {n:,} run events written")
    figures = [versus("read_all, batch 1000", bench_read_all(log, n, size.rounds), 0.5)]
    say("read_all")
    raw, trm = run_child("raw", log, canonical), run_child("trm", log, canonical)
    mb = {
        side: (r["rss_before_kb"] / 1024, r["peak_kb"] / 1024)
        for side, r in (("trm", trm), ("raw", raw))
    }
    say(
        "rebuild RSS, start -> peak: "
        + ", ".join(f"{k} {a:.0f} -> {b:.0f} MB" for k, (a, b) in mb.items())
    )
    if (trm["events"], raw["events"]) != (n, n):
        raise SystemExit(f"rebuilds applied {trm['events']} / {raw['events']} of {n} events")
    if trm["digest"] != raw["digest"]:
        say("[bold red]the reference's runs tables differ from trm's: its figures are off")
    else:
        say(f"the reference's runs tables equal trm's (sha256 {trm['digest'][:12]})")
    rate, raw_rate, cpu = n / trm["seconds"], n / raw["seconds"], raw["cpu"] / trm["cpu"]
    say(f"rebuild per CPU second: trm {n / trm['cpu']:,.0f} ev, raw {n / raw['cpu']:,.0f} ev")
    target = ">= 50,000 ev/s"
    figures.append(
        Figure(f"rebuild {n:,} events", "ev/s", rate, raw_rate, cpu, target, rate >= 50_000)
    )
    peak, raw_peak = mb["trm"][1], mb["raw"][1]
    figures.append(
        Figure("rebuild peak RSS (child)", "MB", peak, raw_peak, None, "< 300 MB", peak < 300)
    )
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the big log")
    parser.add_argument("--quick", action="store_true", help="every section at a small size")
    parser.add_argument("--dir", type=Path, help="where the databases go (default: a temp dir)")
    parser.add_argument("--rebuild-child", nargs=3, help=argparse.SUPPRESS)  # side, db, canonical
    args = parser.parse_args(argv)
    register_workload()
    if args.rebuild_child:
        side, db, canonical = args.rebuild_child
        rebuild_child(side, Path(db), canonical == "1")
        return 0
    console = Console(width=120)
    started, loads = time.perf_counter(), f"{os.getloadavg()[0]:.1f}"
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="store_bench-") as tmp:
        size = sizes(args.quick, args.events)
        figures, plan = measure_appends(Path(tmp), size, console.log)
        figures += measure_log(Path(tmp), size, plan.canonical, console.log)
    table = RichTable(title="trm_store (SQLite) vs raw sqlite3: same SQL, same pragmas, same run")
    for column in ("figure", "trm", "raw", "ratio", "ratio (CPU)", "target", "result"):
        table.add_column(column, justify="left" if column in ("figure", "target") else "right")
    for figure in figures:
        table.add_row(*figure.row())
    console.print(table)
    missed = [f.name for f in figures if not f.passed]
    if missed:
        console.print(f"targets missed: {'; '.join(missed)}", style="bold red")
    else:
        console.print("every target met", style="green")
    console.print(
        f"total {time.perf_counter() - started:.0f} s; load average {loads} -> "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; SQLite {sqlite3.sqlite_version}; "
        f"trm_store from {Path(trm_store.__file__).parent}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
