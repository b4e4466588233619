"""Read latencies of issue 16: the newest event of a 5,000-event stream, and one rare type among
20,000 events, through trm's store against the raw driver doing the same indexed query, and
against the peer the issue measured (`eventsourcing`'s application recorder), in the same run.

The reference is plain `sqlite3` / `psycopg` sending the same SELECT (same columns, same index),
rows fetched but not turned into events. The peer holds the same events (same streams, versions,
types and JSON) in its own tables and answers through its own API: `select_events(stream,
desc=True, limit=1)`, and `select_notifications(..., topics=[type])` paged in 1,000s from the start
until a page comes back short, which is what `read_all(types=[type])` returns. "whole read" is how
trm answered before the indexed reads (read the whole stream / the whole log and pick in Python),
for scale.

    .venv/bin/python bench/read_bench.py [--pg URL] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from eventsourcing.persistence import StoredEvent
from pydantic import BaseModel
from writers_bench import EsWriter

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


PAD = "x" * 100


def others() -> list[tuple[str, str, dict[str, Any]]]:
    """The 15,000 events besides the big stream: (stream, type, data), 20 of them `bench.rare`."""
    count = LOG_EVENTS - STREAM_EVENTS
    every = count // RARE_EVENTS
    return [
        (
            f"other:{i % 100}",
            "bench.rare" if i % every == every // 2 else "bench.tick",
            {"n": i, "payload": PAD},
        )
        for i in range(count)
    ]


def fill(store: Store) -> None:
    """A 5,000-event stream among others, 20,000 events in all, 20 of them `bench.rare`."""
    big = [NewEvent("bench.tick", {"n": i, "payload": PAD}) for i in range(STREAM_EVENTS)]
    for start in range(0, STREAM_EVENTS, 1000):
        store.append("big", big[start : start + 1000])
    items = [(stream, [NewEvent(kind, data)], None) for stream, kind, data in others()]
    for start in range(0, len(items), 500):
        store.append_batch(items[start : start + 500])


def peer_stream(name: str) -> uuid.UUID:
    """The peer's id for one of trm's stream names (its PostgreSQL column is a `uuid`)."""
    return uuid.uuid5(uuid.NAMESPACE_URL, name)


def fill_peer(peer: EsWriter) -> None:
    """The same events as `fill`, in the same order, through the peer's own `insert_events`."""
    versions: dict[str, int] = {}
    stored = []
    rows = [("big", "bench.tick", {"n": i, "payload": PAD}) for i in range(STREAM_EVENTS)]
    for stream, kind, data in rows + others():
        version = versions[stream] = versions.get(stream, 0) + 1
        stored.append(StoredEvent(peer_stream(stream), version, kind, json.dumps(data).encode()))
    for start in range(0, len(stored), 1000):
        peer.recorder.insert_events(stored[start : start + 1000])


def peer_of_type(peer: EsWriter, kind: str) -> list[Any]:
    """Every event of `kind` in the peer's log: its notifications paged from the start."""
    found: list[Any] = []
    start = 1
    while True:
        page = peer.recorder.select_notifications(start, 1000, topics=[kind])
        found += page
        if len(page) < 1000:
            return found
        start = page[-1].id + 1


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


def run(url: str, peer_url: str, rounds: int) -> list[tuple[str, float, float, float, float]]:
    """(read, trm ms, raw ms, peer ms, whole ms) for each read."""
    EsWriter.create_tables(peer_url)
    peer = EsWriter(peer_url)
    with open_store(url, projections={}) as store:
        fill(store)
        fill_peer(peer)
        raw, close = raw_query(url)
        big = peer_stream("big")
        try:
            newest = store.read_stream("big", backwards=True, limit=1)
            assert newest[0].version == STREAM_EVENTS
            assert len(list(store.read_all(types=["bench.rare"]))) == RARE_EVENTS
            newest_peer = peer.recorder.select_events(big, desc=True, limit=1)
            assert newest_peer[0].originator_version == STREAM_EVENTS
            assert len(peer_of_type(peer, "bench.rare")) == RARE_EVENTS
            figures = [
                (
                    "newest of a 5,000-event stream",
                    median_ms(lambda: store.read_stream("big", backwards=True, limit=1), rounds),
                    median_ms(lambda: raw(NEWEST_SQL, "big"), rounds),
                    median_ms(lambda: peer.recorder.select_events(big, desc=True, limit=1), rounds),
                    median_ms(lambda: store.read_stream("big")[-1], max(3, rounds // 20)),
                ),
                (
                    "1 rare type among 20,000",
                    median_ms(lambda: list(store.read_all(types=["bench.rare"])), rounds),
                    median_ms(lambda: raw(RARE_SQL, "bench.rare"), rounds),
                    median_ms(lambda: peer_of_type(peer, "bench.rare"), rounds),
                    median_ms(
                        lambda: [e for e in store.read_all() if e.type == "bench.rare"],
                        max(3, rounds // 50),
                    ),
                ),
            ]
        finally:
            close()
            peer.close()
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
    print(
        f"{'backend':10} {'read':32} {'trm ms':>8} {'raw ms':>8} {'trm/raw':>8}"
        f" {'eventsourcing ms':>17} {'trm/eventsourcing':>18} {'whole ms':>9}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        here = Path(tmp)
        backends = [
            ("sqlite", f"sqlite:///{here / 'read.db'}", f"sqlite:///{here / 'peer.db'}", []),
        ]
        if not args.no_pg:
            (url, drop), (peer_url, drop_peer) = pg_scratch(args.pg), pg_scratch(args.pg)
            backends.append(("postgresql", url, peer_url, [drop, drop_peer]))
        for name, url, peer_url, drops in backends:
            try:
                for what, trm_ms, raw_ms, peer_ms, whole_ms in run(url, peer_url, args.rounds):
                    print(
                        f"{name:10} {what:32} {trm_ms:8.3f} {raw_ms:8.3f} {trm_ms / raw_ms:7.1f}x"
                        f" {peer_ms:17.3f} {trm_ms / peer_ms:17.2f}x {whole_ms:9.1f}"
                    )
            finally:
                for drop in drops:
                    drop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
