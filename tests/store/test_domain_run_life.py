"""A run's life has one direction (issue 14.8): registered once, written by its one writer, ended
once. A finished run refuses registration, a run ended elsewhere (stale, failed by hand) refuses
writes, a nested RunLog of the same id is refused, and a run whose process on this host is gone is
stale at once. Both backends; nothing is written by a refusal."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta

import pytest

from tests.store.helpers import die_in_a_child
from trm_store import RunLog, RunStateError, Store, UnknownRunError, open_store, run_info
from trm_store.domain.run_leases import fail_run, mark_stale_runs, stale_runs

PREDICTION = {"unit_id": "u", "prediction": "A", "correct": True, "stop_reason": "stop"}


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    with open_store(store_url) as s:
        yield s


def _ended(store: Store, run_id: str, *, fails: bool) -> None:
    with pytest.raises(RuntimeError) if fails else nullcontext(), RunLog(store, run_id) as log:
        log.record_prediction("q1", **PREDICTION)
        if fails:
            raise RuntimeError("boom")


@pytest.mark.parametrize("fails", [False, True], ids=["completed", "failed"])
def test_a_finished_run_refuses_registration(store: Store, fails: bool) -> None:
    _ended(store, "r", fails=fails)
    before, head = run_info(store, "r"), store.head_position()
    with pytest.raises(RunStateError, match="registered already"):
        RunLog(store, "r", config={"again": True}).__enter__()
    assert store.head_position() == head
    assert run_info(store, "r") == before  # status, config and error as they were


def test_a_nested_run_log_of_the_same_id_is_refused(store: Store) -> None:
    with RunLog(store, "outer") as outer:
        outer.record_prediction("q1", **PREDICTION)
        refused = pytest.raises(RunStateError, match=r"registered already \(running\)")
        with refused, RunLog(store, "outer") as inner:
            inner.record_prediction("q2", **PREDICTION)
        assert run_info(store, "outer")["status"] == "running"  # the inner did not complete it
        outer.record_prediction("q3", **PREDICTION)
    info = run_info(store, "outer")
    assert (info["status"], info["predictions"]) == ("completed", 2)


def test_a_run_marked_stale_refuses_every_later_write(store: Store) -> None:
    log = RunLog(store, "r", batch_size=1).__enter__()
    log.record_prediction("q1", **PREDICTION)
    later = datetime.now(UTC) + timedelta(days=2)
    assert mark_stale_runs(store, timedelta(days=1), now=later) == ["r"]
    head = store.head_position()
    with pytest.raises(RunStateError, match="failed"):
        log.record_prediction("q2", **PREDICTION)
    with pytest.raises(RunStateError):
        log.heartbeat()
    with pytest.raises(RunStateError):
        log.__exit__(None, None, None)
    assert store.head_position() == head
    info = run_info(store, "r")
    assert (info["status"], info["reason"], info["predictions"]) == ("failed", "stale", 1)
    assert info["heartbeat_at"] is None  # no lease written back for a dead run


def test_a_run_ended_elsewhere_does_not_end_twice_when_its_block_raises(store: Store) -> None:
    with pytest.raises(RunStateError), RunLog(store, "r") as log:
        log.record_prediction("q1", **PREDICTION)
        fail_run(store, "r", reason="operator says so")
    info = run_info(store, "r")
    assert (info["status"], info["reason"], info["error"]) == (
        "failed",
        "operator",
        "operator says so",
    )
    assert [e.type for e in store.read_stream("run:r")] == ["run.registered", "run.failed"]


def test_fail_run_fails_a_running_run_once(store: Store) -> None:
    RunLog(store, "r").__enter__()
    fail_run(store, "r")
    assert run_info(store, "r")["error"] == "failed by an operator"
    head = store.head_position()
    with pytest.raises(RunStateError, match="failed already"):
        fail_run(store, "r")
    with pytest.raises(UnknownRunError):
        fail_run(store, "ghost")
    _ended(store, "done", fails=False)
    with pytest.raises(RunStateError, match="completed already"):
        fail_run(store, "done")
    assert store.head_position() == head + 3  # only the completed run's own events


def _die_with_a_running_run(url: str, run_id: str) -> None:
    """A child registers the run and exits without ending it (as a SIGKILLed harness would)."""
    die_in_a_child(
        url, run_id, "from trm_store import RunLog\nRunLog(store, sys.argv[2]).__enter__()\n"
    )


def test_a_run_whose_process_on_this_host_is_gone_is_stale_at_once(store: Store) -> None:
    _die_with_a_running_run(store.url, "orphan")
    RunLog(store, "alive").__enter__()  # this process: alive, and recent
    found = stale_runs(store, timedelta(days=365))
    assert [r.run_id for r in found] == ["orphan"]
    assert "is gone" in found[0].why
    assert mark_stale_runs(store, timedelta(days=365)) == ["orphan"]
    assert mark_stale_runs(store, timedelta(days=365)) == []  # idempotent
    info = run_info(store, "orphan")
    assert (info["status"], info["reason"]) == ("failed", "stale")
    assert run_info(store, "alive")["status"] == "running"
