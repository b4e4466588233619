"""`trm replay-projections`: rebuild, verify (exit 1 on a difference), typed errors as exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, text

from tests.store.helpers import TOTALS, added
from trm_store import open_store

ROOT = Path(__file__).resolve().parents[2]


def _trm(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tests.store.workers", "cli", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_replay_verify_and_repair(store_url: str) -> None:
    with open_store(store_url, projections=TOTALS) as store:
        for i in range(40):
            store.append(f"s-{i % 3}", [added(i)])

    rebuilt = _trm("replay-projections", "--db", store_url, "--only", "test_totals", "--json")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert json.loads(rebuilt.stdout)["rebuilt"] == {"test_totals": 40}

    clean = _trm("replay-projections", "--db", store_url, "--verify", "--json")
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["differences"] == []

    engine = create_engine(store_url)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM test_totals WHERE stream_id = 's-2'"))
    engine.dispose()
    broken = _trm("replay-projections", "--db", store_url, "--verify")
    assert broken.returncode == 1
    assert "missing from the live table" in broken.stdout

    repaired = _trm("replay-projections", "--db", store_url)
    assert repaired.returncode == 0, repaired.stderr
    assert "test_totals" in repaired.stdout
    assert _trm("replay-projections", "--db", store_url, "--verify").returncode == 0


def test_unknown_projection_and_bad_url_are_typed_errors(sqlite_url: str) -> None:
    unknown = _trm("replay-projections", "--db", sqlite_url, "--only", "nope")
    assert unknown.returncode == 2
    assert "unknown projection" in unknown.stderr
    bad = _trm("replay-projections", "--db", "mysql://x@127.0.0.1/y")
    assert bad.returncode == 2
    assert "unsupported database" in bad.stderr
