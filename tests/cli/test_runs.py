"""`trm runs`: every run with its status, predictions and lease; stale running runs flagged, and
recorded as failed only with --mark-stale (listing alone writes nothing)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.cli.helpers import trm
from trm_store import cli as launch
from trm_store import open_store
from trm_store.domain.run_log import RunLog
from trm_store.domain.runs import run_info


def _record_runs(url: str) -> None:
    """done (3 predictions), boom (failed), alive (running), dead (running, lease 2 hours old)."""
    with open_store(url) as store:
        with RunLog(store, "done") as log:
            for i in range(3):
                log.record_prediction(
                    f"q{i}", unit_id="u", prediction=i, correct=True, stop_reason="stop"
                )
        with pytest.raises(RuntimeError), RunLog(store, "boom"):
            raise RuntimeError("the harness crashed")
        RunLog(store, "alive").__enter__()  # never left: its process "dies" here
        # Two hours before the runs are recorded (not before this module was imported: the
        # table shows the lease's age, and a long session would make it 2.1h).
        hours_ago = datetime.now(UTC) - timedelta(hours=2)
        dead = RunLog(store, "dead", clock=lambda: hours_ago).__enter__()
        dead.record_prediction("q0", unit_id="u", prediction=0, correct=False, stop_reason="stop")
        dead.flush()


def test_list_then_mark_stale(store_url: str, tmp_path: Path) -> None:
    _record_runs(store_url)
    with open_store(store_url) as store:
        head = store.head_position()

    listed = trm("runs", "--db", store_url, "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    report = json.loads(listed.stdout)
    runs = {r["run_id"]: r for r in report["runs"]}
    assert [r["run_id"] for r in report["runs"]] == ["dead", "done", "boom", "alive"]  # by start
    assert {k: (r["status"], r["predictions"]) for k, r in runs.items()} == {
        "done": ("completed", 3),
        "boom": ("failed", 0),
        "alive": ("running", 0),
        "dead": ("running", 1),
    }
    assert runs["boom"]["reason"] == "error" and runs["done"]["ended_at"] is not None
    assert runs["dead"]["lease_age_s"] >= 7200 and 0 <= runs["alive"]["lease_age_s"] < 7200
    assert runs["done"]["lease_age_s"] is None  # a finished run's lease is released
    assert (report["stale"], report["marked_stale"]) == ([], [])  # default: 300 s of silence
    # Every running run has been silent longer than 1 ms by the time a child process reads it.
    tight = ("--stale-after", "0.001")
    flagged = json.loads(trm("runs", "--db", store_url, "--json", *tight, cwd=tmp_path).stdout)
    assert (flagged["stale"], flagged["marked_stale"]) == (["alive", "dead"], [])
    with open_store(store_url) as store:
        assert store.head_position() == head  # listing wrote nothing

    marked = trm("runs", "--db", store_url, "--json", *tight, "--mark-stale", cwd=tmp_path)
    assert marked.returncode == 0, marked.stderr
    report = json.loads(marked.stdout)
    assert (report["stale"], report["marked_stale"]) == ([], ["alive", "dead"])
    with open_store(store_url) as store:
        assert (run_info(store, "dead")["status"], run_info(store, "dead")["reason"]) == (
            "failed",
            "stale",
        )
        assert run_info(store, "done")["status"] == "completed"
        assert store.head_position() == head + 2


def test_table(sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert launch.main(["runs", "--db", sqlite_url]) == 2  # read-only: never creates a store
    assert "no SQLite store at" in capsys.readouterr().err
    open_store(sqlite_url).close()
    assert launch.main(["runs", "--db", sqlite_url]) == 0
    assert "no runs recorded in" in capsys.readouterr().out
    _record_runs(sqlite_url)
    assert launch.main(["runs", "--db", sqlite_url, "--stale-after", "0.001"]) == 0
    out = capsys.readouterr().out
    dead = next(line for line in out.splitlines() if "dead" in line)
    assert "running" in dead and "STALE" in dead and "2.0h" in dead
    assert "completed" in next(line for line in out.splitlines() if "│ done" in line)
    assert "2 running run(s) silent for more than 0.001s: dead, alive" in out


@pytest.mark.parametrize("value", ["0", "-5", "soon", "nan"])
def test_bad_threshold_is_refused(
    value: str, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        launch.main(["runs", "--db", sqlite_url, "--stale-after", value])
    assert exit_.value.code == 2
    assert "must be a number of seconds > 0" in capsys.readouterr().err
