"""`trm runs --fail RUN_ID [--reason TEXT]` fails one running run (issue 14.8); a run already
ended, or never registered, is a one-line error with exit 2 and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.helpers import trm
from trm_store import RunLog, open_store, run_info


def test_fail_one_run_by_hand(store_url: str, tmp_path: Path) -> None:
    with open_store(store_url) as store:
        RunLog(store, "hung").__enter__()
        with RunLog(store, "done"):
            pass

    failed = trm("runs", "--db", store_url, "--fail", "hung", "--reason", "GPU lost", cwd=tmp_path)
    assert failed.returncode == 0, failed.stderr
    assert "run hung is now failed (operator)" in failed.stdout
    with open_store(store_url, read_only=True) as store:
        info = run_info(store, "hung")
        head = store.head_position()
    assert (info["status"], info["reason"], info["error"]) == ("failed", "operator", "GPU lost")

    for run_id, message in [("hung", "failed already"), ("done", "completed already")]:
        again = trm("runs", "--db", store_url, "--fail", run_id, "--json", cwd=tmp_path)
        assert again.returncode == 2
        assert again.stderr.count("\n") == 1 and "RunStateError" in again.stderr
        assert message in again.stderr
    ghost = trm("runs", "--db", store_url, "--fail", "ghost", cwd=tmp_path)
    assert (ghost.returncode, ghost.stderr.count("\n")) == (2, 1)
    assert "UnknownRunError" in ghost.stderr
    lone = trm("runs", "--db", store_url, "--reason", "why", cwd=tmp_path)
    assert lone.returncode == 2 and "--reason goes with --fail" in lone.stderr
    with open_store(store_url, read_only=True) as store:
        assert store.head_position() == head

    listed = json.loads(trm("runs", "--db", store_url, "--json", cwd=tmp_path).stdout)
    assert {r["run_id"]: r["reason"] for r in listed["runs"]} == {"hung": "operator", "done": None}
