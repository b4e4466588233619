"""writers_bench: concurrent writers through trm and through eventsourcing's reference recorder.

The reference is the peer's own: `eventsourcing`'s `SQLiteApplicationRecorder` and
`PostgresApplicationRecorder` (a bench extra, never a runtime dependency), driven with the workload
of its `test_concurrent_throughput` (eventsourcing/tests/persistence.py): 4 workers, each job one
insert of 50 events into a stream of its own (a fresh originator id), after a warm-up of one job per
worker. Here the jobs run from 4 threads sharing one store/recorder, and from 4 processes each
opening its own; each round is 40 jobs (2,000 events) a side instead of the peer's 10, so a round is
not 3 jobs on one worker and 2 on the others. A third shape is that of its
`test_concurrent_no_conflicts` (10 threads, 100 writes of 100 events: 10,000 events), and
single-event appends are timed as its `test_performance` times them (one event into a fresh stream
per insert, sequentially), on PostgreSQL (the issue's figure) and on SQLite at `full`. The 4-worker
shapes run again in rounds of 200 jobs (10,000 events), writers that keep going: a 40-job round
lasts 30-70 ms here, and one slow job at its end weighs on it. eventsourcing's SQLite processes wait
for the write lock in SQLite's busy handler, which sleeps 1 to 100 ms between tries: their jobs took
0.7-2.5 ms at the median and up to 80 ms, trm's (queued in turn on the writer lock) 3.1-3.9 ms and
at most 6.8 ms, so 40-job rounds favour trm and 200-job rounds measure throughput alone
(bench/README, "Twenty-fifth session").

Equal work and durability on both sides:
- the same payload: trm appends `bench.appended` events (store_bench's prediction-shaped
  payload, which no projection subscribes to), eventsourcing stores the same data, as
  `json.dumps` text (trm stores its canonical JSON, a few bytes shorter), as its `state`, with
  the event type as its `topic`;
- SQLite: every write on disk (the WAL `fdatasync`ed) before it returns, on both: trm opened
  with `durability="full"`, which commits at NORMAL and syncs the WAL itself once its writer
  lock is let go (`trm_store.wal_sync`); eventsourcing sets no `synchronous` and gets SQLite's
  default, FULL (2) in WAL mode on this build (`DEFAULT_WAL_SYNCHRONOUS=2`), which syncs inside
  `COMMIT`, and which the bench reads back from a connection of its pool and prints;
- PostgreSQL: the server's settings (`synchronous_commit` on) for both, each in a fresh schema
  of database `test` (dropped after);
- trm's store is opened as users open it: `open_store`, every domain projection registered (none
  takes `bench.appended`, so on PostgreSQL trm's appends are numbered by the database, each in
  one query on a writer connection used within the last second, `trm_store.postgres_append`).

Rounds alternate the sides (which goes first alternates too) and the median is kept; each line
also gives the lowest and highest ratio of a round against the peer's round next to it, which
shows how far this host's noise moves a figure.

    .venv/bin/python bench/writers_bench.py              # 5 rounds a figure
    .venv/bin/python bench/writers_bench.py --rounds 15  # a steadier median, 3x as long
    .venv/bin/python bench/writers_bench.py --quick      # 3 rounds, smaller rounds

Exit code 0 whatever the figures: it is a report, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore
from llm_bench import PG_URL, pg_schema_url
from store_reference import APPENDED, appended, register_workload

import trm_store
from trm_store import NewEvent, Store, open_store


class Writer(Protocol):
    def job(self, events: int) -> None:
        """Append `events` events to a stream of their own, in one transaction."""

    def close(self) -> None: ...


# -- the two sides ------------------------------------------------------------------------------


class TrmWriter:
    """trm's store, opened by `open_store` (every domain projection registered)."""

    def __init__(self, url: str) -> None:
        register_workload()
        durability = "full" if url.startswith("sqlite") else "normal"
        self.store: Store = open_store(url, durability=durability)

    def job(self, events: int) -> None:
        stream = f"bench:{uuid.uuid4().hex}"
        self.store.append(stream, [NewEvent(APPENDED, appended(i)) for i in range(events)])

    def close(self) -> None:
        self.store.close()


class EsWriter:
    """eventsourcing's application recorder: the peer's reference, with trm's payload."""

    def __init__(self, url: str) -> None:
        self.recorder: SQLiteApplicationRecorder | PostgresApplicationRecorder
        if url.startswith("sqlite"):
            self.datastore: SQLiteDatastore | PostgresDatastore = SQLiteDatastore(
                url.removeprefix("sqlite:///")
            )
            self.recorder = SQLiteApplicationRecorder(self.datastore)
        else:
            parts = urlsplit(url)
            schema = parts.query.removeprefix("options=-csearch_path%3D")
            self.datastore = PostgresDatastore(
                dbname=parts.path.lstrip("/"),
                host=parts.hostname or "127.0.0.1",
                port=parts.port or 5432,
                user=parts.username or "postgres",
                password=parts.password or "",
                schema=schema,
                pool_size=5,  # PostgresFactory's defaults
                max_overflow=10,
            )
            self.recorder = PostgresApplicationRecorder(self.datastore)

    @classmethod
    def create_tables(cls, url: str) -> None:
        """Once per database, before any worker opens it: the recorder's `create_table`, run by
        4 processes at once on PostgreSQL, fails with "tuple concurrently updated" (its
        `CREATE OR REPLACE FUNCTION`). trm's `open_store` needs no such step."""
        writer = cls(url)
        writer.recorder.create_table()
        writer.close()

    def job(self, events: int) -> None:
        stream = uuid.uuid4()
        self.recorder.insert_events(
            [
                StoredEvent(stream, i, APPENDED, json.dumps(appended(i)).encode())
                for i in range(events)
            ]
        )

    def close(self) -> None:
        self.datastore.close()


SIDES: dict[str, Callable[[str], Writer]] = {"trm": TrmWriter, "eventsourcing": EsWriter}


# -- workers: threads sharing one writer, or processes with one each ----------------------------

_writer: Writer | None = None
"""A worker process's own writer, opened by its pool's initializer."""


def _open_in_process(side: str, url: str) -> None:
    global _writer
    _writer = SIDES[side](url)


def _job_in_process(events: int, hold: float = 0.0) -> int:
    assert _writer is not None
    time.sleep(hold)  # the warm-up holds each worker, so the pool starts all of them
    _writer.job(events)
    return os.getpid()


@dataclass(frozen=True)
class Workload:
    name: str
    workers: int
    events: int
    """Per job (one insert, one stream)."""
    jobs: int
    """Per round."""
    processes: bool


class Side:
    """One side's workers for one workload, started (and warmed up) before any round."""

    def __init__(self, stack: ExitStack, side: str, url: str, load: Workload) -> None:
        self.load = load
        self.pool: Executor
        if load.processes:
            self.pool = stack.enter_context(
                ProcessPoolExecutor(
                    load.workers,
                    mp_context=get_context("spawn"),
                    initializer=_open_in_process,
                    initargs=(side, url),
                )
            )
            # Until every worker has opened its writer and made one job (a worker that started
            # early can take two held jobs while another is still importing).
            seen: set[int] = set()
            for _ in range(10):
                hold = [(_job_in_process, load.events, 1.0)] * load.workers
                seen.update(f.result() for f in [self.pool.submit(*job) for job in hold])
                if len(seen) == load.workers:
                    break
            else:
                raise SystemExit(f"{side}: the warm-up did not start {load.workers} processes")
        else:
            writer = SIDES[side](url)
            stack.callback(writer.close)
            self.writer = writer
            self.pool = stack.enter_context(ThreadPoolExecutor(load.workers))
            for f in [self.pool.submit(writer.job, load.events) for _ in range(load.workers)]:
                f.result()

    def round(self) -> float:
        """Events/s of one round of jobs."""
        load = self.load
        job = _job_in_process if load.processes else self.writer.job
        start = time.perf_counter()
        for f in [self.pool.submit(job, load.events) for _ in range(load.jobs)]:
            f.result()
        return load.jobs * load.events / (time.perf_counter() - start)


@dataclass(frozen=True)
class Figure:
    """One figure's medians, and each round's trm against the peer's round next to it."""

    trm: float
    peer: float
    pairs: list[tuple[float, float]]

    def ratio(self, higher_is_better: bool) -> float:
        return self.trm / self.peer if higher_is_better else self.peer / self.trm

    def pair_ratios(self, higher_is_better: bool) -> list[float]:
        return [t / p if higher_is_better else p / t for t, p in self.pairs]


def alternate(rounds: int, trm: Callable[[], float], peer: Callable[[], float]) -> Figure:
    """Medians of `rounds` rounds a side, the side that goes first alternating."""
    pairs: list[tuple[float, float]] = []
    for k in range(rounds):
        order = [trm, peer]
        got = {fn: fn() for fn in (order if k % 2 == 0 else order[::-1])}
        pairs.append((got[trm], got[peer]))
    return Figure(
        statistics.median(t for t, _ in pairs), statistics.median(p for _, p in pairs), pairs
    )


def concurrent(urls: dict[str, str], load: Workload, rounds: int) -> Figure:
    EsWriter.create_tables(urls["eventsourcing"])
    with ExitStack() as stack:
        trm = Side(stack, "trm", urls["trm"], load)
        peer = Side(stack, "eventsourcing", urls["eventsourcing"], load)
        return alternate(rounds, trm.round, peer.round)


def singles(urls: dict[str, str], appends: int, rounds: int) -> Figure:
    """Microseconds per single-event append (each into a fresh stream), one thread."""
    EsWriter.create_tables(urls["eventsourcing"])
    with ExitStack() as stack:
        writers = {side: SIDES[side](urls[side]) for side in ("trm", "eventsourcing")}
        for writer in writers.values():
            stack.callback(writer.close)
            writer.job(1)

        def timed(writer: Writer) -> Callable[[], float]:
            def one_round() -> float:
                start = time.perf_counter()
                for _ in range(appends):
                    writer.job(1)
                return (time.perf_counter() - start) / appends * 1e6

            return one_round

        return alternate(rounds, timed(writers["trm"]), timed(writers["eventsourcing"]))


# -- places ------------------------------------------------------------------------------------


@contextmanager
def sqlite_urls(workdir: Path) -> Iterator[dict[str, str]]:
    """A fresh database file per side."""
    names = {side: workdir / f"{side}-{uuid.uuid4().hex[:8]}.db" for side in SIDES}
    yield {side: f"sqlite:///{path}" for side, path in names.items()}


@contextmanager
def pg_urls() -> Iterator[dict[str, str] | None]:
    """A fresh schema per side in database `test` (dropped after), None if unreachable."""
    with pg_schema_url() as trm, pg_schema_url() as peer:
        yield None if trm is None or peer is None else {"trm": trm, "eventsourcing": peer}


def es_synchronous(workdir: Path) -> tuple[int, str]:
    """`PRAGMA synchronous` and `journal_mode` on a connection of eventsourcing's own pool."""
    datastore = SQLiteDatastore(str(workdir / "probe.db"))
    try:
        SQLiteApplicationRecorder(datastore).create_table()
        with datastore.transaction(commit=False) as cursor:
            cursor.execute("PRAGMA synchronous")
            synchronous = cursor.fetchone()[0]
            cursor.execute("PRAGMA journal_mode")
            return synchronous, cursor.fetchone()[0]
    finally:
        datastore.close()


# -- the report ---------------------------------------------------------------------------------


def workloads(quick: bool) -> list[Workload]:
    """The peer's shapes, then the 4-worker ones in rounds five times as long (the module's
    docstring says why)."""
    scale = 4 if quick else 1
    return [
        Workload("4 threads x 50 events", 4, 50, 40 // scale, processes=False),
        Workload("4 processes x 50 events", 4, 50, 40 // scale, processes=True),
        Workload("10 threads x 100 events", 10, 100, 100 // scale, processes=False),
        Workload("4 threads x 50, 200-job rounds", 4, 50, 200 // scale, processes=False),
        Workload("4 processes x 50, 200-job rounds", 4, 50, 200 // scale, processes=True),
    ]


def line(figure: str, got: Figure, unit: str, higher_is_better: bool) -> str:
    """The medians, their ratio and verdict, and the lowest and highest ratio of one round
    against the peer's round next to it: how far the host's noise moves the figure."""
    ratio = got.ratio(higher_is_better)
    pairs = got.pair_ratios(higher_is_better)
    verdict = "pass" if ratio >= 1.0 else "MISSED"
    return (
        f"{figure:<42} trm {got.trm:>9,.0f} {unit:<5} eventsourcing {got.peer:>9,.0f} {unit:<5} "
        f"trm/eventsourcing {ratio:5.3f}x  {verdict:<6} (rounds {min(pairs):.2f}-{max(pairs):.2f})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 smaller rounds a figure")
    parser.add_argument("--rounds", type=int, help="rounds a figure (default 5, 3 with --quick)")
    parser.add_argument("--dir", type=Path, help="where the SQLite files go (default: a temp dir)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 5)
    loads = f"{os.getloadavg()[0]:.2f}"
    started = time.perf_counter()
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="writers_bench-") as tmp:
        workdir = Path(tmp)
        synchronous, journal = es_synchronous(workdir)
        print(
            f"eventsourcing's SQLite connections: synchronous={synchronous} (2 = FULL), "
            f"journal_mode={journal}; trm at durability 'full' (WAL, synchronous=NORMAL, "
            "the WAL synced before each write returns)"
        )
        for load in workloads(args.quick):
            with sqlite_urls(workdir) as urls:
                got = concurrent(urls, load, rounds)
            say(line(f"SQLite full, {load.name}", got, "ev/s", True))
        with sqlite_urls(workdir) as urls:
            got = singles(urls, 25 if args.quick else 100, rounds)
        say(line("SQLite full, 1 event per append (latency)", got, "us", False))
        with pg_urls() as urls:
            if urls is None:
                say("PostgreSQL: unreachable, its figures are missing")
            else:
                for load in workloads(args.quick):
                    got = concurrent(urls, load, rounds)
                    say(line(f"PostgreSQL, {load.name}", got, "ev/s", True))
        with pg_urls() as urls:
            if urls is not None:
                got = singles(urls, 25 if args.quick else 100, rounds)
                say(line("PostgreSQL, 1 event per append (latency)", got, "us", False))
    missed = sum("MISSED" in text for text in lines)
    print("every target met" if not missed else f"{missed} target(s) missed (>= 1.00x)")
    print(
        f"{rounds} rounds a figure, medians; {time.perf_counter() - started:.0f} s; load average "
        f"{loads} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; SQLite "
        f"{sqlite3.sqlite_version}; PostgreSQL at {PG_URL}; trm_store from "
        f"{Path(trm_store.__file__).parent}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
