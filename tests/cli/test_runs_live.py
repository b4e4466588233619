"""A live run's predictions reach `trm runs` within seconds (issue 17 point 7): `RunLog` writes
its buffer once the oldest prediction is `flush_interval_s` (2 s) old, not only every
`batch_size` predictions, so a reader in another process sees a slow run's progress."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from trm_store import Store, open_store
from trm_store.domain.errors import DomainInputError
from trm_store.domain.run_list import list_runs
from trm_store.domain.run_log import RunLog

ROOT = Path(__file__).resolve().parents[2]


def predictions(store: Store, run_id: str) -> list[int]:
    return [
        r["predictions"] for r in list_runs(store, now=datetime.now(UTC)) if r["run_id"] == run_id
    ]


READER = """
import sys, time
from datetime import UTC, datetime
from trm_store import Store, open_store
from trm_store.domain.run_list import list_runs
deadline = time.time() + 20
with open_store(sys.argv[1], read_only=True) as store:
    print("ready", flush=True)
    while time.time() < deadline:
        now = datetime.now(UTC)
        n = [r["predictions"] for r in list_runs(store, now=now) if r["run_id"] == "live"]
        if n and n[0]:
            print(time.time(), n[0])
            break
        time.sleep(0.1)
"""


def test_a_reader_in_another_process_sees_a_lone_prediction_within_seconds(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store, RunLog(store, "live") as log:
        reader = subprocess.Popen(
            [sys.executable, "-c", READER, sqlite_url],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert reader.stdout is not None
        assert reader.stdout.readline() == "ready\n"  # it is polling, and sees no prediction
        recorded = time.time()
        log.record_prediction("q1", unit_id="u1", prediction="4", correct=True, stop_reason="stop")
        out, _ = reader.communicate(timeout=60)  # nothing more is written meanwhile
        assert out, "the reader never saw the prediction"
        seen_at, count = out.split()
        assert int(count) == 1
        assert float(seen_at) - recorded < 3.5
        # The timed flush kept the buffer's promise: written once, nothing left to flush, and
        # its thread ended with the buffer (an idle RunLog holds no thread).
        assert log.flush() == 0
        deadline = time.monotonic() + 5
        while any(t.name == "RunLog(live) flusher" for t in threading.enumerate()):
            assert time.monotonic() < deadline, "the flusher outlived its buffer"
            time.sleep(0.05)
    with open_store(sqlite_url) as store:
        assert predictions(store, "live") == [1]


def test_by_count_only_when_asked(sqlite_url: str) -> None:
    with open_store(sqlite_url) as store, RunLog(store, "quiet", flush_interval_s=None) as log:
        log.record_prediction("q1", unit_id="u1", prediction="4", correct=True, stop_reason="stop")
        time.sleep(0.5)
        assert predictions(store, "quiet") == [0]
        assert log.flush() == 1


@pytest.mark.parametrize("interval", [0, -1.0, float("nan"), float("inf"), True, "2"])
def test_a_bad_interval_is_refused(sqlite_url: str, interval: object) -> None:
    with open_store(sqlite_url) as store, pytest.raises(DomainInputError):
        RunLog(store, "x", flush_interval_s=interval)  # type: ignore[arg-type]
