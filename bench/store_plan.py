"""What the store sends per append, learnt from the store itself, and the check that the raw
reference sends the same SQL and stores the same rows: store_bench's guard on its reference.

The workload and the reference live in store_reference.py; store_bench.py times and reports.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import event
from store_reference import (
    APPENDED,
    INSERT_COLUMNS,
    TIMESTAMP,
    Plan,
    RawLog,
    Statement,
    Var,
    appended,
    dumps,
)

from trm_store import NewEvent, RecordedEvent, Store, open_store
from trm_store.backend import Durability


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


LAST_ROW = "SELECT data, meta, length(recorded_at) FROM events ORDER BY position DESC LIMIT 1"


@contextmanager
def capturing(store: Store) -> Iterator[list[tuple[str, Any]]]:
    """The (SQL, parameters) the store sends to the driver while the block runs.

    The listener goes on this store's engine only: a listener on the Engine class would switch
    SQLAlchemy's event checks on in every engine of the process, the timed ones included.
    """
    engine = store._backend.engine
    sent: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_rest: Any) -> None:
        sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", capture)


def learn(workdir: Path) -> Plan:
    """Capture one append by the store: its SQL is what the reference will send.

    A 1000-event append first makes the head (1000, 1001) distinct from the constants the
    store sends (0s, projection versions), so each value sent is recognised for what it is.
    """
    store = fresh(workdir / "trm.db")
    try:
        store.append("bench:warm-up", [NewEvent(APPENDED, appended(k)) for k in range(1000)])
        with capturing(store) as sent:  # two streams: the store may read the second one apart
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
        if sql in ("BEGIN IMMEDIATE", "COMMIT"):
            continue
        if columns := INSERT_COLUMNS.match(sql):
            steps["columns"] = tuple(c.strip() for c in columns[1].split(","))
            # The two events' rows: in one statement (multi-row VALUES), or one row a parameter
            # set (executemany). The plan keeps the one-row text; the reference widens it.
            steps["insert"] = sql[: sql.index(")", columns.end()) + 1]
            steps["multi_row"] = len(params) == 2 * len(steps["columns"])
        elif e.event_id in params:
            steps["by_id"] = sql
        elif Var.STREAM in step(sql, params).params and "max(position)" in sql:
            # With the projections' rows since 8545f51, unless their epoch (the last
            # parameter) is the one the store knows, since migration 0006.
            learnt = step(sql, params)
            steps["heads"] = Statement(sql, (*learnt.params[:-1], Var.EPOCH))
        elif "projection_state" in sql:
            steps["advance"] = step(sql, params)
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
        with capturing(store) as sent:
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
