"""Read latencies of issue 16: the newest event of a 5,000-event stream, and one rare type among
20,000 events, through trm's store against the raw driver doing the same indexed query.

The reference is plain `sqlite3` / `psycopg` sending the same SELECT (same columns, same index),
rows fetched but not turned into events; "whole read" is how trm answered before the indexed
reads (read the whole stream / the whole log and pick in Python), for scale.

    .venv/bin/python bench/read_bench.py [--pg URL] [--rounds N]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trm_store import NewEvent, Store, open_store, register_event_type

STREAM_EVENTS, LOG_EVENTS, RARE_EVENTS = 5_000, 20_000, 20
COLUMNS = (
    "position, event_id, stream_id, stream_version, type, schema_version, data, meta, recorded_at"
)
NEWEST_SQL = (
    f"SELECT {COLUMNS} FROM events WHERE stream_id = {{p}} ORDER BY stream_version DESC LIMIT 1"
)
RARE_SQL = f"SELECT {COLUMNS} FROM events WHERE type = {{p}} ORDER BY position"


class Tick(BaseModel):
    n: int
    payload: str = ""


register_event_type("bench.tick", Tick)
register_event_type("bench.rare", Tick)


def fill(store: Store) -> None:
    """A 5,000-event stream among others, 20,000 events in all, 20 of them `bench.rare`."""
    pad = "x" * 100
    big = [NewEvent("bench.tick", {"n": i, "payload": pad}) for i in range(STREAM_EVENTS)]
    for start in range(0, STREAM_EVENTS, 1000):
        store.append("big", big[start : start + 1000])
    others = LOG_EVENTS - STREAM_EVENTS
    every = others // RARE_EVENTS
    items = []
    for i in range(others):
        kind = "bench.rare" if i % every == every // 2 else "bench.tick"
        items.append((f"other:{i % 100}", [NewEvent(kind, {"n": i, "payload": pad})], None))
    for start in range(0, len(items), 500):
        store.append_batch(items[start : start + 500])


def median_ms(call: Callable[[], object], rounds: int) -> float:
    call()  # warm: statements compiled, pages cached
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def raw_query(url: str) -> tuple[Callable[[str, str], list[Any]], Callable[[], None]]:
    """(run one SELECT with one parameter on the raw driver, close)."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        return (lambda sql, p: conn.execute(sql.format(p="?"), (p,)).fetchall()), conn.close
    import psycopg

    dsn, _, query = url.removeprefix("postgresql+psycopg://").partition("?")
    options = query.removeprefix("options=").replace("%3D", "=") if query else ""
    pg = psycopg.connect(f"postgresql://{dsn}", options=options, autocommit=True)
    return (lambda sql, p: pg.execute(sql.format(p="%s"), (p,)).fetchall()), pg.close


def run(url: str, rounds: int) -> list[tuple[str, float, float, float]]:
    with open_store(url, projections={}) as store:
        fill(store)
        raw, close = raw_query(url)
        try:
            newest = store.read_stream("big", backwards=True, limit=1)
            assert newest[0].version == STREAM_EVENTS
            assert len(list(store.read_all(types=["bench.rare"]))) == RARE_EVENTS
            figures = [
                (
                    "newest of a 5,000-event stream",
                    median_ms(lambda: store.read_stream("big", backwards=True, limit=1), rounds),
                    median_ms(lambda: raw(NEWEST_SQL, "big"), rounds),
                    median_ms(lambda: store.read_stream("big")[-1], max(3, rounds // 20)),
                ),
                (
                    "1 rare type among 20,000",
                    median_ms(lambda: list(store.read_all(types=["bench.rare"])), rounds),
                    median_ms(lambda: raw(RARE_SQL, "bench.rare"), rounds),
                    median_ms(
                        lambda: [e for e in store.read_all() if e.type == "bench.rare"],
                        max(3, rounds // 50),
                    ),
                ),
            ]
        finally:
            close()
    return figures


def pg_scratch(url: str) -> tuple[str, Callable[[], None]]:
    """A fresh schema on `url` for the run, and how to drop it."""
    from sqlalchemy import create_engine, text

    schema = "bench_" + uuid.uuid4().hex[:12]
    admin = create_engine(url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))

    def drop() -> None:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()

    return f"{url}?options=-csearch_path%3D{schema}", drop


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args(argv)
    print(f"{'backend':10} {'read':32} {'trm ms':>8} {'raw ms':>8} {'trm/raw':>8} {'whole ms':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        backends = [("sqlite", f"sqlite:///{Path(tmp) / 'read.db'}", lambda: None)]
        if not args.no_pg:
            backends.append(("postgresql", *pg_scratch(args.pg)))
        for name, url, drop in backends:
            try:
                for what, trm_ms, raw_ms, whole_ms in run(url, args.rounds):
                    ratio = trm_ms / raw_ms
                    print(
                        f"{name:10} {what:32} {trm_ms:8.3f} {raw_ms:8.3f} {ratio:7.1f}x"
                        f" {whole_ms:9.1f}"
                    )
            finally:
                drop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
