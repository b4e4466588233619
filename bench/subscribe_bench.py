"""Subscription latency (issue 16 point 3): from an append in another process to the event's
delivery by `Store.subscribe` here, p50/p95, on SQLite and PostgreSQL.

The writer process stamps each event with the wall-clock time just before its `append` and
reports how long the append took; commit-to-delivery is the stamp-to-delivery time less the
append's own (the commit is its last step). Both are printed: on a database other writers share,
the append waits for the writer lock and stamp-to-delivery shows that wait. Targets (for
commit-to-delivery): p95 <= 50 ms on PostgreSQL, <= 250 ms on SQLite.

The peer the issue measured, `eventsourcing`, is timed the same way in the same run where it
has a subscription: its `PostgresApplicationRecorder.subscribe` (LISTEN/NOTIFY, a listening
thread that checks for a notification every 0.1 s), the writer appending through its
`insert_events`. Its SQLite recorder has none (`subscribe` raises NotImplementedError).

    .venv/bin/python bench/subscribe_bench.py [--events N] [--interval-ms MS] [--no-pg]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from eventsourcing.persistence import StoredEvent
from pydantic import BaseModel
from writers_bench import EsWriter

from trm_store import NewEvent, open_store, register_event_type


class Stamped(BaseModel):
    sent_at: float


register_event_type("bench.stamped", Stamped)


def write(url: str, events: int, interval_s: float) -> None:
    """The writer process: one append per interval, each stamped just before it is sent."""
    with open_store(url, projections={}) as store:
        for i in range(events):
            time.sleep(interval_s)
            sent_at = time.time()
            store.append(f"w:{i % 4}", [NewEvent("bench.stamped", {"sent_at": sent_at})])
            print((time.time() - sent_at) * 1000, flush=True)  # the append's own share


def write_peer(url: str, events: int, interval_s: float) -> None:
    """`write`, through the peer's recorder: one `insert_events` of one event per interval."""
    peer = EsWriter(url)
    streams = [uuid.uuid4() for _ in range(4)]
    try:
        for i in range(events):
            time.sleep(interval_s)
            sent_at = time.time()
            state = json.dumps({"sent_at": sent_at}).encode()
            stream = streams[i % 4]
            peer.recorder.insert_events([StoredEvent(stream, i // 4 + 1, "bench.stamped", state)])
            print((time.time() - sent_at) * 1000, flush=True)
    finally:
        peer.close()


def follow(url: str, events: int, interval_s: float, peer: bool) -> tuple[list[float], list[float]]:
    """Latencies (ms) of `events` appends made by a child process, as this one receives them,
    and the appends' own durations (ms, as the writer saw them): through trm, or the peer."""
    mode = "--write-peer" if peer else "--write"
    command = [sys.executable, __file__, mode, url, str(events), str(interval_s)]
    latencies = []
    if peer:
        EsWriter.create_tables(url)
        reader = EsWriter(url)
        try:
            with reader.recorder.subscribe(gt=0) as sub:
                writer = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
                for notification in sub:
                    sent_at = json.loads(notification.state)["sent_at"]
                    latencies.append((time.time() - sent_at) * 1000)
                    if len(latencies) == events:
                        break
        finally:
            reader.close()
    else:
        open_store(url, projections={}).close()
        with open_store(url, projections={}, read_only=True) as store, store.subscribe() as sub:
            writer = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
            for event in sub:
                latencies.append((time.time() - event.data["sent_at"]) * 1000)
                if len(latencies) == events:
                    break
    appends, _ = writer.communicate(timeout=60)
    return latencies, [float(line) for line in appends.split()]


def percentiles(values: list[float]) -> tuple[float, float]:
    """p50 and p95."""
    ordered = sorted(values)
    return statistics.median(ordered), ordered[max(0, int(len(ordered) * 0.95) - 1)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--interval-ms", type=float, default=10.0)
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    parser.add_argument("--write", nargs=3, help=argparse.SUPPRESS)  # url, events, interval
    parser.add_argument("--write-peer", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for given, writer in ((args.write, write), (args.write_peer, write_peer)):
        if given:
            writer(given[0], int(given[1]), float(given[2]))
            return 0
    from read_bench import pg_scratch

    interval = args.interval_ms / 1000
    print(
        f"{'backend':10} {'side':13} {'events':>6} {'p50 ms':>7} {'p95 ms':>7} {'max ms':>7}"
        f" {'target':>7} {'append p50/p95 ms':>18} {'stamp-to-delivery':>18}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        backends = [("sqlite", f"sqlite:///{Path(tmp) / 'sub.db'}", lambda: None, 250, False)]
        if not args.no_pg:
            backends.append(("postgresql", *pg_scratch(args.pg), 50, False))
            backends.append(("postgresql", *pg_scratch(args.pg), 50, True))
        for name, url, drop, target, peer in backends:
            try:
                got, appends = follow(url, args.events, interval, peer)
            finally:
                drop()
            # One writer, so the i-th event delivered is its i-th append.
            after_commit = [max(0.0, g - a) for g, a in zip(got, appends, strict=True)]
            (p50, p95), (a50, a95) = percentiles(after_commit), percentiles(appends)
            (s50, s95) = percentiles(got)
            print(
                f"{name:10} {'eventsourcing' if peer else 'trm':13} {len(got):6} {p50:7.1f}"
                f" {p95:7.1f} {max(after_commit):7.1f} {target:7} {a50:8.1f} / {a95:7.1f}"
                f" {s50:8.1f} / {s95:7.1f}"
            )
    print("sqlite     eventsourcing  no subscription: its SQLite recorder's `subscribe` raises")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
