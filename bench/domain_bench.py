"""domain_bench: 100,000 predictions through `RunLog` against raw sqlite3, in the same run.

Both sides write into a database created by `open_store` (same migrations: the events table with
its unique constraints, index and append-only triggers), with the same pragmas (WAL,
synchronous=NORMAL, the same busy timeout), in transactions of the same batch size. The raw
reference inserts the very rows the store wrote, read back from the store's database before the
clock starts: every prediction's event row (same event id, stream version, data and meta JSON
text, recorded_at) and its `predictions` projection row, with `executemany`, one
`BEGIN IMMEDIATE ... COMMIT` per batch. That is the figure the target applies to. A second
reference inserts the event rows only (half the rows RunLog writes), for comparison. What the
reference skips is what trm adds: validation, serialising JSON, SQLAlchemy, the projection
runner, the retry-safe ids and the run's lease. A last row times the store core alone
(`Store.append_batch` of the same events, no projections, no RunLog) to show where the time goes.

    .venv/bin/python bench/domain_bench.py                 # 100,000 predictions, batches of 200
    .venv/bin/python bench/domain_bench.py -n 20000 --batch-size 500 --rounds 5

Exit code 0 whatever the figures: it is a report, not a test (target: RunLog >= 0.4x raw).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trm_store import NewEvent, open_store
from trm_store.domain.run_log import RunLog
from trm_store.sqlite import BUSY_TIMEOUT_MS

INSERT_EVENT = (
    "INSERT INTO events (position, event_id, stream_id, stream_version, type, schema_version, "
    "data, meta, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
INSERT_PREDICTION = (
    "INSERT INTO predictions (run_id, question_id, seq, unit_id, prediction, correct, "
    "stop_reason, fields) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def prediction(i: int) -> dict[str, Any]:
    """One realistic prediction's arguments."""
    return {
        "question_id": f"q{i:07d}",
        "unit_id": f"u{i // 5:06d}",
        "prediction": "ABCD"[i % 4],
        "correct": i % 3 != 0,
        "stop_reason": "stop" if i % 40 else "length",
        "latency_ms": 250.0 + (i * 7919) % 4000 / 4,
        "tokens": 100 + (i * 104729) % 900,
    }


def through_runlog(url: str, n: int, batch_size: int) -> float:
    """Seconds to record `n` predictions with RunLog (registration and completion included).

    The arguments are built before the clock starts, as the raw side's rows are."""
    calls = []
    for i in range(n):
        p = prediction(i)
        calls.append((p.pop("question_id"), p))
    with open_store(url) as store:
        start = time.perf_counter()
        with RunLog(store, "bench-run", batch_size=batch_size) as log:
            for question_id, arguments in calls:
                log.record_prediction(question_id, **arguments)
        return time.perf_counter() - start


def event_rows(url: str) -> list[tuple[Any, ...]]:
    """The prediction events the store wrote, as the raw reference will insert them."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        return conn.execute(
            "SELECT position, event_id, stream_id, stream_version, type, schema_version, data, "
            "meta, recorded_at FROM events WHERE type = 'run.prediction_recorded' "
            "ORDER BY position"
        ).fetchall()


def projection_rows(url: str) -> list[tuple[Any, ...]]:
    """The `predictions` rows the store wrote, in the order of their events."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        return conn.execute(
            "SELECT run_id, question_id, seq, unit_id, prediction, correct, stop_reason, fields "
            "FROM predictions ORDER BY seq"
        ).fetchall()


def raw(
    path: Path,
    rows: list[tuple[Any, ...]],
    batch_size: int,
    projection_rows: list[tuple[Any, ...]] | None = None,
) -> float:
    """Seconds for raw sqlite3 to insert `rows` (and `projection_rows`, built beforehand as the
    event rows are) in batches of `batch_size`, one transaction per batch."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    start = time.perf_counter()
    for offset in range(0, len(rows), batch_size):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(INSERT_EVENT, rows[offset : offset + batch_size])
        if projection_rows is not None:
            conn.executemany(INSERT_PREDICTION, projection_rows[offset : offset + batch_size])
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed


def core_only(path: Path, rows: list[tuple[Any, ...]], batch_size: int) -> float:
    """Seconds for `Store.append_batch` alone to append the same events (no projections)."""
    events = [NewEvent(e[4], json.loads(e[6])) for e in rows]
    with open_store(f"sqlite:///{path}", projections={}) as store:
        start = time.perf_counter()
        for offset in range(0, len(events), batch_size):
            store.append_batch([("run:bench-run", events[offset : offset + batch_size], None)])
        return time.perf_counter() - start


def fresh_store(directory: Path, name: str) -> Path:
    """A database created by open_store (schema and projection tables), nothing appended."""
    path = directory / name
    open_store(f"sqlite:///{path}").close()
    return path


def one_round(directory: Path, n: int, batch_size: int) -> dict[str, float]:
    """Seconds of each writer, RunLog first (the raw sides insert the rows it wrote)."""
    url = f"sqlite:///{directory / 'runlog.db'}"
    store_s = through_runlog(url, n, batch_size)
    rows = event_rows(url)
    assert len(rows) == n, f"the store wrote {len(rows)} predictions, not {n}"
    predicted = projection_rows(url)
    assert len(predicted) == n, f"the store projected {len(predicted)} predictions"
    return {
        "RunLog.record_prediction (trm)": store_s,
        "raw sqlite3: event rows + projection rows": raw(
            fresh_store(directory, "raw2.db"), rows, batch_size, predicted
        ),
        "raw sqlite3: event rows": raw(fresh_store(directory, "raw.db"), rows, batch_size),
        "Store.append_batch alone (no projections)": core_only(
            directory / "core.db", rows, batch_size
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=100_000, help="predictions (default 100,000)")
    parser.add_argument("--batch-size", type=int, default=200, help="per transaction (200)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are kept (3)")
    args = parser.parse_args()
    rounds = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            rounds.append(one_round(Path(tmp), args.n, args.batch_size))
    seconds = {label: statistics.median(r[label] for r in rounds) for label in rounds[0]}
    ratios = {
        name: [r[label] / r["RunLog.record_prediction (trm)"] for r in rounds]
        for name, label in (
            ("the same rows (event + projection)", "raw sqlite3: event rows + projection rows"),
            ("event rows only", "raw sqlite3: event rows"),
        )
    }
    print(f"domain_bench  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC")
    print(
        f"{args.n:,} predictions, batches of {args.batch_size}, SQLite WAL synchronous=NORMAL, "
        f"median of {args.rounds} rounds"
    )
    print(f"{'writer':44} {'seconds':>8} {'predictions/s':>14}")
    for label, median in seconds.items():
        print(f"{label:44} {median:8.2f} {args.n / median:14,.0f}")
    for name, values in ratios.items():
        each = ", ".join(f"{v:.2f}" for v in values)
        print(f"ratio RunLog / raw, {name}: {statistics.median(values):.2f}x  (rounds: {each})")
    print("target: RunLog >= 0.4x raw inserting the same rows")


if __name__ == "__main__":
    main()
