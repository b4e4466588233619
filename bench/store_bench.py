"""store_bench: trm's SQLite event store against raw sqlite3 doing the same work in the same run.

The reference is honest: its database is created by `open_store` (same migrations, triggers,
indexes, trm's domain projections and their bookkeeping), its connection uses the same pragmas,
and per append it sends the very SQL the store sends, in the same order: the SQL text and its
constants are learnt from a captured store append (`learn`), the values are computed by hand,
and one append of each shape is compared statement by statement and row by row before anything
is timed (`check`). It skips only what trm adds on top of SQL: validation, SQLAlchemy and the
projection runner. The rebuild reference re-implements the `runs` projection by hand and must
produce identical tables (compared by hash after the run). The workload and the reference live
in store_reference.py, the learning and the check in store_plan.py; this file times them and
reports.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable
from store_plan import Shape, check, fresh, learn
from store_reference import (
    BATCH,
    SQL_WRITE,
    Plan,
    RawLog,
    connect,
    dumps,
    raw_read_all,
    raw_rebuild,
    register_workload,
    run_log,
    sql_time,
)

import trm_store
from trm_store import open_store
from trm_store.backend import Durability
from trm_store.projection_rebuild import paused_cyclic_gc

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
        with paused_cyclic_gc():  # as `trm replay-projections` runs it
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
