"""store_bench: trm's SQLite event store against raw sqlite3 doing the same work in the same run.

The reference is honest: its database is created by `open_store` (same migrations, triggers,
indexes, trm's domain projections and their bookkeeping), its connection uses the same pragmas,
and per append it sends the very SQL the store sends, in the same order: the SQL text and its
constants are learnt from a captured store append (`learn`), the values are computed by hand,
and one append of each shape is compared statement by statement and row by row before anything
is timed (`check`). It skips only what trm adds on top of SQL: validation, SQLAlchemy and the
projection runner. The rebuild reference re-implements the `runs` projection by hand and must
produce identical tables (compared by hash after the run). The workload and the reference live
in store_reference.py; this file times them and reports.

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
import resource
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable
from sqlalchemy import event
from store_reference import (
    APPENDED,
    BATCH,
    INSERT_COLUMNS,
    SQL_WRITE,
    TIMESTAMP,
    Plan,
    RawLog,
    Statement,
    Var,
    appended,
    connect,
    dumps,
    raw_read_all,
    raw_rebuild,
    register_workload,
    run_log,
    sql_time,
)

import trm_store
from trm_store import NewEvent, RecordedEvent, Store, open_store
from trm_store.backend import Durability

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
    # Into the database file: the first reader must not pay for checkpointing the setup's WAL.
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
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
    fsyncs: tuple[int, int]
    """(appends per round, rounds) at `full` durability: many short rounds. An fsync's latency
    drifts over seconds and a WAL checkpoint (several fsyncs) lands in one side's round or the
    other's: 7 rounds of 150 appends gave ratios from 0.77x to 1.00x on one commit, 301 rounds
    of 10 gave 0.95x to 0.98x on the same commit."""
    batches: int
    events: int


def sizes(quick: bool, events: int) -> Sizes:
    if quick:
        return Sizes(rounds=3, singles=60, fsyncs=(10, 9), batches=4, events=min(events, 10_000))
    return Sizes(rounds=7, singles=1000, fsyncs=(10, 301), batches=50, events=events)


def measure_appends(
    workdir: Path, size: Sizes, say: Callable[[str], None]
) -> tuple[list[Figure], Plan]:
    one, hundred, spread = Shape(1, 1), Shape(1, 100), Shape(10, 10)
    plan = learn(workdir)
    if diffs := check(workdir, one, plan) + check(workdir, spread, plan):
        raise SystemExit("the reference does not do what the store does:\n" + "\n".join(diffs))
    lookup = "with" if plan.by_id else "without"
    say(f"the reference sends the store's SQL ({lookup} an id lookup) and stores the same rows")
    durabilities: tuple[tuple[Durability, tuple[int, int], float], ...] = (
        ("normal", (size.singles, size.rounds), 0.5),
        ("full", size.fsyncs, 0.9),
    )
    figures = []
    for durability, rounds, target in durabilities:
        rates = bench_appends(workdir, durability, one, rounds, plan)
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
