"""Runs and predictions (seed task 8): registration, batching, read-only use, leases, crashes."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
from sqlalchemy import Column, Connection, MetaData, String, Table

from trm_store import (
    EventValidationError,
    NewEvent,
    ReadOnlyStoreError,
    RecordedEvent,
    Store,
    open_store,
)
from trm_store.domain.errors import RunStateError, UnknownRunError
from trm_store.domain.run_leases import _mark, mark_stale_runs, stale_runs
from trm_store.domain.run_list import list_runs, run_statuses
from trm_store.domain.run_log import RunLog
from trm_store.domain.runs import run_info
from trm_store.projections import Projection, registered_projections

ROOT = Path(__file__).resolve().parents[2]
WORKER = (sys.executable, "-m", "tests.store.domain_workers")
T0 = datetime.now(UTC)
"""The tests' start of time: lease times are compared with the log's own `recorded_at` (the
store's wall clock), so test clocks start from now and jump days ahead to make a run silent."""


class Clock:
    """A settable clock for RunLog and mark_stale_runs."""

    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as opened:
        yield opened


def _predict(log: RunLog, i: int, **fields: object) -> None:
    log.record_prediction(
        f"q{i:04d}", unit_id=f"u{i // 3}", prediction="A", correct=i % 2 == 0,
        stop_reason="stop", **fields,
    )  # fmt: skip


def test_a_run_registers_on_enter_and_completes_on_exit(store: Store) -> None:
    clock = Clock()
    with RunLog(store, "r1", config={"model": "m", "seed": 3}, clock=clock) as log:
        info = run_info(store, "r1")
        assert (info["status"], info["started_at"], info["config"]) == (
            "running", T0, {"model": "m", "seed": 3},
        )  # fmt: skip
        assert info["heartbeat_at"] == T0
        _predict(log, 0, latency_ms=12.5)
        clock.now = T0 + timedelta(minutes=3)
    info = run_info(store, "r1")
    assert (info["status"], info["finished_at"], info["predictions"]) == (
        "completed", T0 + timedelta(minutes=3), 1,
    )  # fmt: skip
    assert info["heartbeat_at"] is None  # the lease is released
    registered = store.read_stream("run:r1")[0]
    assert registered.type == "run.registered"
    assert {"started_at", "config", "host", "pid"} <= set(registered.data)
    assert log.predictions() == [
        {
            "question_id": "q0000", "unit_id": "u0", "prediction": "A", "correct": True,
            "stop_reason": "stop", "latency_ms": 12.5,
        }
    ]  # fmt: skip


def test_a_block_that_raises_fails_the_run_with_the_error(store: Store) -> None:
    with pytest.raises(ValueError, match="grader exploded"), RunLog(store, "r1") as log:
        _predict(log, 0)
        raise ValueError("grader exploded")
    info = run_info(store, "r1")
    assert (info["status"], info["reason"]) == ("failed", "error")
    assert info["error"] == "ValueError: grader exploded"
    assert info["predictions"] == 1  # what was recorded before the error is kept
    assert [e.type for e in store.read_stream("run:r1")][-1] == "run.failed"


def test_reading_a_baseline_run_read_only_leaves_it_untouched(store_url: str) -> None:
    """Seed task 8: register_run=False appends nothing and works on a read_only store, so a
    baseline run's started_at and status are the same after it is read."""
    with open_store(store_url) as store:
        with RunLog(store, "baseline", clock=Clock()) as log:
            for i in range(5):
                _predict(log, i)
        before = run_info(store, "baseline")
        head = store.head_position()

    with open_store(store_url, read_only=True) as ro:
        with RunLog(ro, "baseline", register_run=False) as reader:
            assert len(reader.predictions()) == 5
            with pytest.raises(RunStateError):
                _predict(reader, 99)
        after = run_info(ro, "baseline")
        with pytest.raises(ReadOnlyStoreError), RunLog(ro, "baseline"):
            pass  # registering needs a writable store

    with open_store(store_url) as store:
        with RunLog(store, "baseline", register_run=False) as reader:
            assert len(reader.predictions()) == 5
        assert store.head_position() == head
        again = run_info(store, "baseline")
    for seen in (after, again):
        assert (seen["started_at"], seen["status"]) == (before["started_at"], "completed")
        assert seen == before


def test_register_run_false_needs_a_registered_run(store: Store) -> None:
    with pytest.raises(UnknownRunError), RunLog(store, "never", register_run=False):
        pass
    assert store.head_position() == 0


def test_predictions_are_written_one_transaction_per_batch(store: Store) -> None:
    with RunLog(store, "r1", batch_size=4, flush_interval_s=None) as log:  # by count only
        registered = store.head_position()
        for i in range(3):
            _predict(log, i)
        assert store.head_position() == registered  # buffered
        _predict(log, 3)
        batch = store.read_stream("run:r1", from_version=2)
        assert len(batch) == 4
        assert len({e.recorded_at for e in batch}) == 1  # one append, one transaction
        _predict(log, 4)
        assert log.flush() == 1
        assert log.flush() == 0
        _predict(log, 5)
        assert len(log.predictions()) == 6  # reading flushes first
    assert run_info(store, "r1")["predictions"] == 6


def test_what_a_caller_changes_after_recording_reaches_neither_log_nor_read_model(
    store: Store,
) -> None:
    """RunLog's buffered events are written without `append_prepared`'s check that each is as
    `prepare` left it: this holds because `prepare` keeps none of its caller's objects, so the
    caller changing its own values after recording them (while they wait in the buffer) changes
    nothing written."""
    answer: list[Any] = ["A", {"why": ["x"]}]
    notes: dict[str, Any] = {"tags": ["t1"], "scores": {"f1": 0.5}}
    with RunLog(store, "r1", batch_size=100, flush_interval_s=None) as log:
        log.record_prediction(
            "q1", unit_id="u1", prediction=answer, correct=True, stop_reason="stop", notes=notes
        )
        answer.append("B")
        answer[1]["why"].append("y")
        notes["tags"].append("t2")
        notes["scores"]["f1"] = 0.9
        notes["extra"] = 1
        assert log.flush() == 1
        (recorded,) = [e for e in store.read_stream("run:r1") if e.data.get("question_id")]
        (row,) = log.predictions()
    written = {"tags": ["t1"], "scores": {"f1": 0.5}}
    assert recorded.data["prediction"] == ["A", {"why": ["x"]}] == row["prediction"]
    assert recorded.data["fields"] == {"notes": written}
    assert row["notes"] == written
    assert store.verify_projections() == []


class _ChangesDataThenFails(Projection):
    """Lowers each prediction in the event's own data, and fails its first write."""

    name: ClassVar[str] = "test_lowering"
    version: ClassVar[int] = 1
    event_types: ClassVar[frozenset[str]] = frozenset({"run.prediction_recorded"})

    def __init__(self) -> None:
        self.failed = False

    def define(self, metadata: MetaData, suffix: str) -> dict[str, Table]:
        return {"t": Table(f"test_lowering{suffix}", metadata, Column("q", String(9)))}

    def apply(self, conn: Connection, tables: Any, events: Sequence[RecordedEvent]) -> None:
        for event in events:
            event.data["prediction"] = str(event.data["prediction"]).lower()
        if not self.failed:
            self.failed = True
            raise RuntimeError("the projection's first write fails")


def test_a_buffer_a_failed_flush_showed_to_projections_is_checked_when_written_again(
    store_url: str,
) -> None:
    """A failed flush hands the buffered events to the projections, which may change their
    data in place; RunLog writes them again as any caller's events, checked, so the changed
    data is refused rather than applied to the read model while the log keeps the original."""
    runs = {"runs": registered_projections()["runs"], "test_lowering": _ChangesDataThenFails()}
    with open_store(store_url, projections=runs) as store:
        with (
            pytest.raises(EventValidationError, match="its data changed"),
            RunLog(store, "r1", batch_size=100, flush_interval_s=None) as log,
        ):
            log.record_prediction(
                "q1", unit_id="u1", prediction="ANSWER", correct=True, stop_reason="stop"
            )
            with pytest.raises(RuntimeError, match="first write fails"):
                log.flush()
            log.flush()
        assert [e.type for e in store.read_stream("run:r1")] == ["run.registered", "run.failed"]
        assert store.verify_projections() == []


def test_recording_a_question_again_replaces_it_in_the_read_model(store: Store) -> None:
    with RunLog(store, "r1", batch_size=2) as log:
        for i in range(3):
            _predict(log, i)
        log.record_prediction(
            "q0001", unit_id="u0", prediction="B", correct=None, stop_reason="error"
        )
    predictions = RunLog(store, "r1", register_run=False).predictions()
    assert [(p["question_id"], p["prediction"]) for p in predictions] == [
        ("q0000", "A"), ("q0001", "B"), ("q0002", "A"),
    ]  # fmt: skip
    assert sum(e.type == "run.prediction_recorded" for e in store.read_stream("run:r1")) == 4
    assert run_info(store, "r1")["predictions"] == 3  # the run's count: questions, not events
    assert store.verify_projections() == []


def test_a_listing_of_the_newest_runs_and_of_statuses_reads_only_them(store: Store) -> None:
    for r in range(4):
        with RunLog(store, f"r{r}", clock=Clock(T0 + timedelta(seconds=r))) as log:
            for i in range(r):
                _predict(log, i)
    everything = list_runs(store, now=T0)
    assert [(x["run_id"], x["predictions"]) for x in everything] == [
        ("r0", 0), ("r1", 1), ("r2", 2), ("r3", 3),
    ]  # fmt: skip
    assert list_runs(store, now=T0, newest=2) == everything[-2:]  # still oldest first
    assert run_statuses(store, ["r3", "r1", "nope"]) == {"r3": "completed", "r1": "completed"}


def test_a_runlog_is_used_once_and_only_inside_with(store: Store) -> None:
    log = RunLog(store, "r1")
    with pytest.raises(RunStateError):
        _predict(log, 0)
    with log:
        _predict(log, 0)
    with pytest.raises(RunStateError):
        _predict(log, 1)
    with pytest.raises(RunStateError), log:
        pass
    assert run_info(store, "r1")["predictions"] == 1


def test_a_log_that_registers_a_run_twice_keeps_its_first_start(store: Store) -> None:
    """RunLog registers a run once (test_domain_run_life), but a log written before that rule
    may hold a second registration: the projection still folds it, keeping the first start."""
    with pytest.raises(RuntimeError), RunLog(store, "r1", clock=Clock()):
        raise RuntimeError("crash")
    again = {"started_at": T0 + timedelta(hours=1), "config": None, "host": "h", "pid": 1}
    store.append("run:r1", [NewEvent("run.registered", again)])
    info = run_info(store, "r1")
    assert (info["status"], info["started_at"], info["error"]) == ("running", T0, None)


def test_a_silent_run_is_marked_stale_once(store: Store) -> None:
    clock = Clock()
    dead = RunLog(store, "dead", clock=clock).__enter__()  # its process "dies": never exits
    _predict(dead, 0)
    dead.flush()
    clock.now = T0 + timedelta(days=3)
    with RunLog(store, "alive", clock=clock) as alive:
        assert mark_stale_runs(store, timedelta(days=1), now=clock.now) == ["dead"]
        assert mark_stale_runs(store, timedelta(days=1), now=clock.now) == []
        alive.heartbeat()
    info = run_info(store, "dead")
    assert (info["status"], info["reason"]) == ("failed", "stale")
    assert run_info(store, "alive")["status"] == "completed"
    assert [e.type for e in store.read_stream("run:dead")].count("run.failed") == 1


def test_two_markers_cannot_both_fail_a_run(store: Store) -> None:
    RunLog(store, "dead", clock=Clock()).__enter__()
    now = T0 + timedelta(days=3)
    seen_by_both = stale_runs(store, timedelta(days=1), now=now)
    assert [r.run_id for r in seen_by_both] == ["dead"]
    assert _mark(store, seen_by_both[0], now) is True
    assert _mark(store, seen_by_both[0], now) is False  # the stream moved: nothing appended
    assert [e.type for e in store.read_stream("run:dead")] == ["run.registered", "run.failed"]


def test_a_run_that_writes_after_being_found_silent_is_not_marked(store: Store) -> None:
    clock = Clock()
    log = RunLog(store, "slow", clock=clock, batch_size=1).__enter__()
    now = T0 + timedelta(days=3)
    found = stale_runs(store, timedelta(days=1), now=now)
    _predict(log, 0)  # alive after all
    assert _mark(store, found[0], now) is False
    assert run_info(store, "slow")["status"] == "running"


def test_sigkill_loses_at_most_the_unflushed_batch(sqlite_url: str) -> None:
    """A real child records predictions in batches of 25 and is SIGKILLed at random points: the
    log holds whole batches only, a gap-free prefix, at least every batch it reported flushed."""
    batch, rng = 25, random.Random(8)
    for round_ in range(3):
        run_id = f"crash-{round_}"
        child = subprocess.Popen(
            [*WORKER, "predict", sqlite_url, run_id, str(batch)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        reported = 0
        for _ in range(rng.randint(1, 8)):
            line = child.stdout.readline()
            assert line, child.stderr.read() if child.stderr else ""
            reported = int(line)
        child.send_signal(signal.SIGKILL)
        child.communicate()
        assert child.returncode == -signal.SIGKILL

        with open_store(sqlite_url) as store:
            predictions = RunLog(store, run_id, register_run=False).predictions()
            kept = len(predictions)
            assert kept >= reported and kept % batch == 0
            assert [p["question_id"] for p in predictions] == [f"q{i:07d}" for i in range(kept)]
            assert run_info(store, run_id)["status"] == "running"
            assert store.verify_projections() == []
            later = datetime.now(UTC) + timedelta(hours=1)
            assert run_id in mark_stale_runs(store, timedelta(minutes=5), now=later)
            assert run_info(store, run_id)["reason"] == "stale"
